#!/usr/bin/env bash
# GPU, session 22 (2026-12-07), call 2, same build as session22c.sh (the machine still warm):
# the tensor-core GEMVs' warps a block on the dense 8B presets (MLXCEL_TC_WARPS=4|8|16 against
# the rule's choice), then the representative sweep, then the llama step under Nsight. About 9 minutes warm.
source "$(dirname "$0")/common.sh"
t0=$SECONDS; mkdir -p $OUT; unpack_ptx
nvidia-smi --query-gpu=name --format=csv,noheader >> $OUT/report.txt
rlog "== tensor-core GEMV warps [t=$((SECONDS - t0))]"
for p in llama-3.1-8b-4bit qwen3-8b-4bit; do
  rrun bench rule-$p $p
  for w in 4 8 16; do rrun bench warps$w-$p $p MLXCEL_TC_WARPS=$w; done
  rrun bench rule-$p $p
done
rlog "== sweep [t=$((SECONDS - t0))]"
rrun sweep
rlog "== the llama step kernel by kernel (512-token context) [t=$((SECONDS - t0))]"
P=512 rrun ncu_step llama llama-3.1-8b-4bit
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
