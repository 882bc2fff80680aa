#!/usr/bin/env bash
# GPU, 2026-12-06 (11), last call: the final build's checks (parity twice: the third call had one
# unreproduced failure of the batched-prefill test), and serve's 64-row step with the per-head
# paged attention merging its own partials against the combine launch.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
MLXCEL_REQUIRE_CUDA=1 timeout 170 .gpu/tests/gpu-test --test-threads 1 --skip every_kernel > /tmp/tests.txt 2>&1; echo "gpu-test rc=$?"
grep -E "test result|FAILED" /tmp/tests.txt | head
grep -A20 "panicked" /tmp/tests.txt | head -40
for r in 1 2; do
  MLXCEL_REQUIRE_CUDA=1 timeout 60 .gpu/tests/parity_cuda-test > /tmp/parity.txt 2>&1; echo "parity $r rc=$?"
  grep -E "test result|panicked" -A3 /tmp/parity.txt | head
done
echo "== serve's step [t=$((SECONDS - t0))]"
batch 64
batch 64 MLXCEL_ATT_MERGE=0
echo "[t=$((SECONDS - t0))]"
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
