#!/usr/bin/env bash
# GPU, session 24 (2026-12-07), call 2: the experts' down product and the combine in one launch
# (tc_gather_combine, a token's pairs of a tile in a thread-block cluster). Checks, then
# qwen3-30b-a3b decode against MLXCEL_CUDA_FUSE_DOWN=0, alternating, and the MoE step under
# Nsight; the decode attention's keys a split and heads a block, by their variables.
source "$(dirname "$0")/common.sh"
checked_report
rlog "== MoE: down product with the combine / apart [t=$((SECONDS - t0))]"
for i in 1 2 3; do
  rrun bench down-combine qwen3-30b-a3b-4bit
  rrun bench down-apart qwen3-30b-a3b-4bit MLXCEL_CUDA_FUSE_DOWN=0
done
rlog "== decode attention: keys a split (default 32), 4 heads a block [t=$((SECONDS - t0))]"
for p in qwen3-30b-a3b-4bit llama-3.1-8b-4bit; do
  rrun bench att-default-$p $p
  rrun bench att-keys16-$p $p MLXCEL_ATT_KEYS=16
  rrun bench att-keys64-$p $p MLXCEL_ATT_KEYS=64
  rrun bench att-group4-$p $p MLXCEL_ATT_LANES_GROUP=1
done
rlog "== MoE step under Nsight [t=$((SECONDS - t0))]"
P=512 rrun ncu_step moe qwen3-30b-a3b-4bit
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
