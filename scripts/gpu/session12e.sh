#!/usr/bin/env bash
# GPU, 2026-12-06 (12), fifth call: moe_sort with its expert scans by warp shuffles (thread 0
# walked the experts alone: 13.8 us a launch with tiles). Checks in full (parity twice), then
# qwen3-30b-a3b prefill against grouped_qmm, and its prefill kernels (Nsight Compute). Stage as
# for session12.sh.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
PARITY_RUNS=2 checks_in_full
echo "== moe [t=$((SECONDS - t0))]"
bench moe-1 qwen3-30b-a3b-4bit
bench moe-qmm qwen3-30b-a3b-4bit MLXCEL_MOE_ROWS=0
bench moe-2 qwen3-30b-a3b-4bit
echo "== prefill kernels [t=$((SECONDS - t0))]"
prefill_kernels qwen3-30b-a3b-4bit 26
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/ncu.err; tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
