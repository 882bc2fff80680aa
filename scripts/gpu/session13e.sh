#!/usr/bin/env bash
# GPU, 2026-12-06 (13), fifth call: the session's closing figures. parity_cuda (now with the
# qwen2_moe fixture; gpu-test ran on these kernels in calls 3 and 4), the representative sweep
# (into $OUT/sweep.md), then serve at 64 concurrent streams (scripts/gpu/serve-bench.sh's method).
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
MLXCEL_REQUIRE_CUDA=1 timeout 90 .gpu/tests/parity_cuda-test > /tmp/parity.txt 2>&1; echo "parity rc=$?"
grep -E "test result|panicked|qwen2_moe" -A3 /tmp/parity.txt | head -20
echo "== sweep [t=$((SECONDS - t0))]"
COMMIT=$(cat .gpu/commit 2>/dev/null || echo wip) sweep
cp /tmp/sweep.md $OUT/sweep.md
echo "[t=$((SECONDS - t0))]"
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
CONC=64 SERVE_S=120 bash scripts/gpu/serve-bench.sh >> $OUT/report.txt 2>&1
tail -12 $OUT/report.txt
