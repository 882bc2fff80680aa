#!/usr/bin/env bash
# GPU, 2026-12-07 (20), closing call: main with the double-buffered batch-1 GLU chosen by rounds
# of tiles. Checks (and gpu-test with the plain GLU forced), decode against MLXCEL_TC_DB_GLU=0
# side by side, the representative sweep. About 6 minutes warm.
source "$(dirname "$0")/common.sh"
checked_report
rlog "== gpu-test, MLXCEL_TC_DB_GLU=0 [t=$((SECONDS - t0))]"
MLXCEL_TC_DB_GLU=0 MLXCEL_REQUIRE_CUDA=1 timeout 150 .gpu/tests/gpu-test --test-threads 1 --skip every_kernel > /tmp/tests0.txt 2>&1
rlog "gpu-test DB_GLU=0 rc=$?"; rrun grep -E "test result|panicked" /tmp/tests0.txt
rlog "== decode: default (rule), plain GLU (MLXCEL_TC_DB_GLU=0) [t=$((SECONDS - t0))]"
for p in qwen3-8b-4bit llama-3.1-8b-4bit gemma3-1b-4bit; do
  rrun bench rule-$p $p; rrun bench plain-$p $p MLXCEL_TC_DB_GLU=0
done
rlog "== sweep [t=$((SECONDS - t0))]"
rrun sweep
cp /tmp/sweep.md $OUT/ 2>/dev/null
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
