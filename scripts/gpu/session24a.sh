#!/usr/bin/env bash
# GPU, session 24 (2026-12-07), call 1: the MoE router inside the routed GLU's launch
# (tc_gather_qglu_route). Checks of the whole build (also the first GPU run of session 23's
# last two refactors), qwen3-30b-a3b decode against MLXCEL_CUDA_FUSE_ROUTE_GLU=0, alternating,
# the MoE step under Nsight, then the sweep (2 runs each).
source "$(dirname "$0")/common.sh"
checked_report
rlog "== MoE: router in the routed GLU / apart [t=$((SECONDS - t0))]"
for i in 1 2 3; do
  rrun bench route-glu qwen3-30b-a3b-4bit
  rrun bench route-apart qwen3-30b-a3b-4bit MLXCEL_CUDA_FUSE_ROUTE_GLU=0
done
rlog "== sweep [t=$((SECONDS - t0))]"
SWEEP_R=2 rrun sweep
cp /tmp/sweep.md $OUT/sweep.md 2>/dev/null
rlog "== MoE step under Nsight [t=$((SECONDS - t0))]"
P=512 rrun ncu_step moe qwen3-30b-a3b-4bit
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
