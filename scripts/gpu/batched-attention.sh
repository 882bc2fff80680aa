#!/usr/bin/env bash
# GPU: the grouped decode attention's longer splits in batched steps (fewer partials to merge),
# checked (op cases, fused patterns) and measured at 8 and 64 rows against 32 keys a split
# everywhere (MLXCEL_ATT_KEYS=32), then serve's table. One file back: $OUT/report.txt.
source "$(dirname "$0")/common.sh"
{
MLXCEL_REQUIRE_CUDA=1 timeout 150 .gpu/tests/gpu-test --test-threads 1 --skip every_kernel > /tmp/tests.txt 2>&1; echo "gpu-test rc=$?"
grep -E "test result|elements off|panicked|: " /tmp/tests.txt | grep -v "^\s*[0-9]*: " | head -30
for n in 64 8; do batch $n; batch $n MLXCEL_ATT_KEYS=32; done
tail -2 /tmp/bench.err
echo "== serve"; SERVE_S=170 timeout 250 bash scripts/gpu/serve-bench.sh
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
