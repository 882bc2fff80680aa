#!/usr/bin/env bash
# GPU, 2026-12-06 (11), last call: the final build's checks (parity twice: the third call had one
# unreproduced failure of the batched-prefill test), and serve's 64-row step with the per-head
# paged attention merging its own partials against the combine launch.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
PARITY_RUNS=2 checks_in_full
echo "== serve's step [t=$((SECONDS - t0))]"
batch 64
batch 64 MLXCEL_ATT_MERGE=0
echo "[t=$((SECONDS - t0))]"
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
