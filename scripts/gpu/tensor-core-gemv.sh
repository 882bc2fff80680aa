#!/usr/bin/env bash
# GPU: the tensor-core 4-bit GEMV: op cases and fused patterns, GEMV throughput against the
# CUDA-core one, and decode side by side under: the defaults, shared-x products apart, RoPE apart,
# and the CUDA-core GEMV (MLXCEL_GEMV_TC=0); parity last.
cd "$(dirname "$0")/../.."
lib=$(dirname "$(find / -name 'libcublas.so.1*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}" MLXCEL_CACHE_DIR=${MLXCEL_CACHE_DIR:-/tmp/mlxcel-cache} MLXCEL_TEST_ROOT=$PWD
mkdir -p "$MLXCEL_CACHE_DIR"; cp .gpu/extra/ptx-*.ptx "$MLXCEL_CACHE_DIR"/ 2>/dev/null
t0=$(date +%s)
MLXCEL_REQUIRE_CUDA=1 timeout 240 .gpu/tests/gpu-test --test-threads 1 --skip every_kernel > $OUT/tests.txt 2>&1; echo "gpu-test rc=$? ($(( $(date +%s) - t0 )) s)"
grep -E "test result|differ|panicked|FAIL" $OUT/tests.txt | head -20
for cfg in default MLXCEL_GEMV_TC=0; do
  env $( [ $cfg = default ] || echo $cfg ) timeout 60 .gpu/tests/gpu-test gemv_throughput --ignored --nocapture 2>&1 | grep "^| [0-9]" | cut -d'|' -f2,3,5,6 | sed "s/^/$cfg /"
done | tee $OUT/gemv.txt
presets=${PRESETS:-llama-3.1-8b-4bit,qwen3-8b-4bit}
for cfg in default MLXCEL_CUDA_FUSE_PRODUCTS=0 MLXCEL_CUDA_FUSE_ROPE=0 MLXCEL_GEMV_TC=0; do
  env $( [ $cfg = default ] || echo $cfg ) MLXCEL=.gpu/bin/mlxcel MLXCEL_COMMIT=${COMMIT:-wip}-$cfg timeout 150 bash scripts/bench_representative.sh -o $OUT/bench-$cfg.md --only $presets -- --device cuda -p 512 -g 128 -r 2 2>> $OUT/bench.err >/dev/null
  grep "^| [a-z]" $OUT/bench-$cfg.md | cut -d'|' -f2,6,7 | sed "s/^/$cfg /"
done
for cfg in default MLXCEL_GEMV_TC=0; do
  env $( [ $cfg = default ] || echo $cfg ) MLXCEL=.gpu/bin/mlxcel MLXCEL_COMMIT=${COMMIT:-wip}-$cfg timeout 150 bash scripts/bench_representative.sh -o $OUT/moe-$cfg.md --only qwen3-30b-a3b-4bit -- --device cuda -p 512 -g 128 -r 2 2>> $OUT/bench.err >/dev/null
  grep "^| [a-z]" $OUT/moe-$cfg.md | cut -d'|' -f2,6,7 | sed "s/^/$cfg /"
done
MLXCEL_REQUIRE_CUDA=1 timeout 90 .gpu/tests/parity_cuda-test > $OUT/parity.txt 2>&1; echo "parity rc=$?"
grep -E "test result|panicked" $OUT/parity.txt | head -5
