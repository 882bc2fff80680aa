#!/usr/bin/env bash
# GPU, second call of a session: serve's throughput table (under the variables given, e.g.
# MLXCEL_SMALL_BATCH_TC=1) and the representative sweep. One file back: $OUT/report.txt (and
# serve's files).
source "$(dirname "$0")/common.sh"
{
echo "== serve $*"; env "$@" SERVE_S=${SERVE_S:-170} timeout 250 bash scripts/gpu/serve-bench.sh
sweep
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
