#!/usr/bin/env bash
# GPU, short: correctness (op cases, fused patterns, parity) and llama decode under the
# defaults and with each new piece turned off; MoE under the defaults.
cd "$(dirname "$0")/../.."
lib=$(dirname "$(find / -name 'libcublas.so.1*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}" MLXCEL_CACHE_DIR=/tmp/mlxcel-cache MLXCEL_TEST_ROOT=$PWD
mkdir -p "$MLXCEL_CACHE_DIR"; cp .gpu/extra/ptx-*.ptx "$MLXCEL_CACHE_DIR"/ 2>/dev/null
MLXCEL_REQUIRE_CUDA=1 timeout 120 .gpu/tests/gpu-test --test-threads 1 --skip every_kernel > $OUT/tests.txt 2>&1; echo "gpu-test rc=$?"
grep -E "test result|differ|panicked|FAIL|mismatch" $OUT/tests.txt | head -20
MLXCEL_REQUIRE_CUDA=1 timeout 40 .gpu/tests/parity_cuda-test > $OUT/parity.txt 2>&1; echo "parity rc=$?"
for cfg in default MLXCEL_CUDA_FUSE_PRODUCTS=0 MLXCEL_CUDA_FUSE_ROPE=0 MLXCEL_GEMV_TC=0; do
  env $( [ $cfg = default ] || echo $cfg ) timeout 40 .gpu/bin/mlxcel bench --preset llama-3.1-8b-4bit --device cuda -p 512 -g 128 -r 2 --json > $OUT/llama-$cfg.json 2>> $OUT/bench.err
  echo "$cfg $(grep -o '"decode_tps_mean"[^,]*' $OUT/llama-$cfg.json | head -1) $(grep -o '"prefill_tps_mean"[^,]*' $OUT/llama-$cfg.json | head -1)"
done
timeout 60 .gpu/bin/mlxcel bench --preset qwen3-30b-a3b-4bit --device cuda -p 512 -g 128 -r 2 --json > $OUT/moe.json 2>> $OUT/bench.err
echo "moe $(grep -o '"decode_tps_mean"[^,]*' $OUT/moe.json | head -1)"
timeout 30 .gpu/bin/mlxcel bench --preset gemma3-1b-4bit --device cuda -p 512 -g 128 -r 2 --json > $OUT/gemma.json 2>> $OUT/bench.err
echo "gemma $(grep -o '"decode_tps_mean"[^,]*' $OUT/gemma.json | head -1) $(grep -o '"bytes_per_token"[^,]*' $OUT/gemma.json | head -1) $(grep -o '"dtype"[^,]*' $OUT/gemma.json | head -1)"
