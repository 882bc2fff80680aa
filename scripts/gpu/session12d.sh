#!/usr/bin/env bash
# GPU, 2026-12-06 (12), fourth call: the final build. Checks in full with parity_cuda three
# times (captures that fail now fall back to an eager run); the MoE combine at prefill with 8
# outputs a thread (weighted_sum_rows8), seen in qwen3-30b-a3b's prefill kernels (Nsight
# Compute); then the representative sweep and the SmolLM2-shaped preset. Stage as for
# session12.sh.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
PARITY_RUNS=3 checks_in_full
echo "== prefill kernels [t=$((SECONDS - t0))]"
prefill_kernels qwen3-30b-a3b-4bit 16
echo "== sweep [t=$((SECONDS - t0))]"
sweep
cp /tmp/sweep.md $OUT/sweep.md
bench smollm2 smollm2-135m-4bit
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/ncu.err; tail -5 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
