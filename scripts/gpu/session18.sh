#!/usr/bin/env bash
# GPU, 2026-12-07 (18), first call: the default checks and the fused patterns with
# MLXCEL_QMM_GLU=1 (its launch fix); serve's table with the benchmark's clients sending together
# and the engine gathering a burst, with the step log; the 64-row step with the batched attention
# aimed at 4096 (default), 2048 and 1024 blocks; the representative sweep of six presets. About
# 7 minutes warm.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader
echo "== checks (defaults)"
checks_in_full
echo "== fused patterns with MLXCEL_QMM_GLU=1 [t=$((SECONDS - t0))]"
MLXCEL_QMM_GLU=1 MLXCEL_REQUIRE_CUDA=1 timeout 100 .gpu/tests/gpu-test fused_decode_patterns > /tmp/glu.txt 2>&1; echo "rc=$?"
grep -E "test result|panicked" -A3 /tmp/glu.txt | head -8
echo "== serve [t=$((SECONDS - t0))]"
serve_steps SERVE_S=200
echo "== 64-row step, attention aiming at 4096 / 2048 / 1024 blocks [t=$((SECONDS - t0))]"
for b in 4096 2048 1024; do batch 64 MLXCEL_ATT_BATCH_BLOCKS=$b; done
echo "== sweep [t=$((SECONDS - t0))]"
COMMIT=$(cat .gpu/extra/commit 2>/dev/null || echo wip) sweep
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cp /tmp/sweep.md $OUT/ 2>/dev/null
cat $OUT/report.txt
