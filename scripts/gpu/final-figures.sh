#!/usr/bin/env bash
# GPU: correctness (op cases, fused patterns, parity), then the representative sweep of every
# preset with the defaults (3 runs each), for the figures in docs/benchmark_results/. One file
# back: $OUT/report.txt (and the sweep's table).
source "$(dirname "$0")/common.sh"
{
gpu_checks
sweep
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
