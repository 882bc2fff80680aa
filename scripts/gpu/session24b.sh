#!/usr/bin/env bash
# GPU, session 24 (2026-12-07), call 2: the experts' down product and the combine in one launch
# (tc_gather_combine, a token's pairs of a tile in a thread-block cluster). Checks, then
# qwen3-30b-a3b decode against MLXCEL_CUDA_FUSE_DOWN=0, alternating, and the MoE step under
# Nsight.
source "$(dirname "$0")/common.sh"
checked_report
rlog "== MoE: down product with the combine / apart [t=$((SECONDS - t0))]"
for i in 1 2 3; do
  rrun bench down-combine qwen3-30b-a3b-4bit
  rrun bench down-apart qwen3-30b-a3b-4bit MLXCEL_CUDA_FUSE_DOWN=0
done
rlog "== MoE step under Nsight [t=$((SECONDS - t0))]"
P=512 rrun ncu_step moe qwen3-30b-a3b-4bit
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
