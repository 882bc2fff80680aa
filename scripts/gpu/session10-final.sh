#!/usr/bin/env bash
# GPU, 2026-12-06 (10), the session's last call: checks (failures in full), serve's table at
# concurrency 1/8/32/64 (issue 8), the sweep of six presets plus the SmolLM2-shaped preset
# (the real GGUF does not fit a call beside the build); PROFILE=1: the llama prefill kernel by
# kernel too.
# Stage as for session9-gemv.sh; carry [".gpu"].
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
(timeout 120 .gpu/bin/mlxcel synth --preset llama-3.1-8b-4bit --out /tmp/m8b --force > /tmp/synth.txt 2>&1; echo "synth rc=$?") &
MLXCEL_REQUIRE_CUDA=1 timeout 150 .gpu/tests/gpu-test --test-threads 1 --skip every_kernel > /tmp/tests.txt 2>&1; echo "gpu-test rc=$?"
grep -E "test result|FAILED" /tmp/tests.txt | head
grep -A12 "panicked" /tmp/tests.txt | head -40
MLXCEL_REQUIRE_CUDA=1 timeout 60 .gpu/tests/parity_cuda-test > /tmp/parity.txt 2>&1; echo "parity rc=$?"
grep -E "test result|panicked" /tmp/parity.txt | head
wait
echo "== serve [t=$((SECONDS - t0))]"
SERVE_S=150 timeout 200 bash scripts/gpu/serve-bench.sh
echo "== sweep [t=$((SECONDS - t0))]"
sweep
bench smollm2 smollm2-135m-4bit
[ -n "${PROFILE:-}" ] && PRESETS=llama-3.1-8b-4bit timeout 90 bash scripts/gpu/prefill-kernels.sh
echo "[t=$((SECONDS - t0))]"
} > $OUT/report.txt 2>&1
cp /tmp/sweep.md $OUT/ 2>/dev/null
cat $OUT/report.txt
