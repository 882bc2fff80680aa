#!/usr/bin/env bash
# GPU, session 23 (2026-12-07), call 3; main with the router's product in its launch (a
# cluster, moe_router_cl): checks, qwen3-30b-a3b decode against
# MLXCEL_CUDA_FUSE_ROUTER_PRODUCT=0, alternating, then the sweep (2 runs each).
source "$(dirname "$0")/common.sh"
checked_report
rlog "== MoE: router with its product / apart [t=$((SECONDS - t0))]"
for i in 1 2 3; do
  rrun bench router-product qwen3-30b-a3b-4bit
  rrun bench router-apart qwen3-30b-a3b-4bit MLXCEL_CUDA_FUSE_ROUTER_PRODUCT=0
done
rlog "== sweep [t=$((SECONDS - t0))]"
SWEEP_R=2 rrun sweep
cp /tmp/sweep.md $OUT/sweep.md 2>/dev/null
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
