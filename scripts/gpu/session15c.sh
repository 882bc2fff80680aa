#!/usr/bin/env bash
# GPU, 2026-12-06 (15), closing call at the session's final build (attention_lanes per head at
# one row, 4 heads a block in batched steps; new op cases of batched groups of 4 and 8): the
# default checks, then serve's table at 1, 8, 32 and 64 streams (about 3 minutes warm).
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
echo "== default checks"
checks_in_full
echo "== serve [t=$((SECONDS - t0))]"
SERVE_S=150 bash scripts/gpu/serve-bench.sh
echo "[t=$((SECONDS - t0))]"
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
