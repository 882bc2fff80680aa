#!/usr/bin/env bash
# GPU: the tensor-core 4-bit GEMV against the CUDA-core one: op cases and fused patterns under
# each, GEMV throughput per shape and warps per block, decode bench side by side, parity.
cd "$(dirname "$0")/../.."
lib=$(dirname "$(find / -name 'libcublas.so.1*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}" MLXCEL_CACHE_DIR=${MLXCEL_CACHE_DIR:-/tmp/mlxcel-cache} MLXCEL_TEST_ROOT=$PWD
mkdir -p "$MLXCEL_CACHE_DIR"; cp .gpu/extra/ptx-*.ptx "$MLXCEL_CACHE_DIR"/ 2>/dev/null
t0=$(date +%s)
MLXCEL_REQUIRE_CUDA=1 timeout 240 .gpu/tests/gpu-test --test-threads 1 --skip every_kernel > $OUT/tests.txt 2>&1; echo "gpu-test rc=$? ($(( $(date +%s) - t0 )) s)"
ls "$MLXCEL_CACHE_DIR" > $OUT/cache-names.txt
grep -E "test result|differ|panicked|FAIL" $OUT/tests.txt | head -20
for tc in 0 1; do
  MLXCEL_GEMV_TC=$tc timeout 60 .gpu/tests/gpu-test gemv_throughput --ignored --nocapture 2>&1 | grep "^|" | sed "s/^/tc=$tc /"
done | tee $OUT/gemv.txt
for w in 2 4 8 16; do
  MLXCEL_TC_WARPS=$w timeout 60 .gpu/tests/gpu-test gemv_throughput --ignored --nocapture 2>&1 | grep "^| [0-9]" | sed "s/^/warps=$w /"
done | tee -a $OUT/gemv.txt
for tc in 0 1; do
  MLXCEL_GEMV_TC=$tc MLXCEL=.gpu/bin/mlxcel MLXCEL_COMMIT=${COMMIT:-wip}-tc$tc timeout 120 bash scripts/bench_representative.sh -o $OUT/bench-tc$tc.md --only llama-3.1-8b-4bit,qwen3-8b-4bit -- --device cuda -p 512 -g 128 -r 3 2>> $OUT/bench.err >/dev/null
  grep "^| [a-z]" $OUT/bench-tc$tc.md | sed "s/^/tc=$tc /"
done
MLXCEL_REQUIRE_CUDA=1 timeout 90 .gpu/tests/parity_cuda-test > $OUT/parity.txt 2>&1; echo "parity rc=$?"
grep -E "test result|panicked" $OUT/parity.txt | head -5
