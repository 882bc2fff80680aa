#!/usr/bin/env bash
# GPU, for the session after 2026-12-07 (21), not yet run: the routed GLU's one-round rule
# (0087eb0) checked on the device against the old 8 warps a block (MLXCEL_GATHER_GLU_WARPS=8),
# alternating, with the MoE step kernel by kernel; the tensor-core GEMVs' warps a block on the
# dense 8B presets (MLXCEL_TC_WARPS=4|8|16 against the rule's choice, never swept since the
# double-buffered GLU); the representative sweep (the H200 one is due: none since session 19).
# About 6 minutes warm.
source "$(dirname "$0")/common.sh"
checked_report
rlog "== MoE decode: the rule against 8 warps a GLU block [t=$((SECONDS - t0))]"
for i in 1 2 3; do
  rrun bench rule-moe qwen3-30b-a3b-4bit
  rrun bench glu8-moe qwen3-30b-a3b-4bit MLXCEL_GATHER_GLU_WARPS=8
done
P=512 rrun ncu_step moe qwen3-30b-a3b-4bit
rlog "== tensor-core GEMV warps [t=$((SECONDS - t0))]"
for p in llama-3.1-8b-4bit qwen3-8b-4bit; do
  for i in 1 2; do
    rrun bench rule-$p $p
    for w in 4 8 16; do rrun bench warps$w-$p $p MLXCEL_TC_WARPS=$w; done
  done
done
rlog "== sweep [t=$((SECONDS - t0))]"
rrun sweep
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
