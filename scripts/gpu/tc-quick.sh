#!/usr/bin/env bash
# GPU, short: correctness (op cases, fused patterns, parity), then decode side by side: llama
# with each piece off, qwen2.5-0.5b with the dense q/k/v launch off, MoE under auto and bf16
# (issue 6), Gemma, and a per-family profile of the 8B step.
cd "$(dirname "$0")/../.."
lib=$(dirname "$(find / -name 'libcublas.so.1*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}" MLXCEL_CACHE_DIR=/tmp/mlxcel-cache MLXCEL_TEST_ROOT=$PWD
mkdir -p "$MLXCEL_CACHE_DIR"; cp .gpu/extra/ptx-*.ptx "$MLXCEL_CACHE_DIR"/ 2>/dev/null
MLXCEL_REQUIRE_CUDA=1 timeout 120 .gpu/tests/gpu-test --test-threads 1 --skip every_kernel > $OUT/tests.txt 2>&1; echo "gpu-test rc=$?"
grep -E "test result|differ|panicked|FAIL|mismatch" $OUT/tests.txt | head -20
MLXCEL_REQUIRE_CUDA=1 timeout 40 .gpu/tests/parity_cuda-test > $OUT/parity.txt 2>&1; echo "parity rc=$?"
bench() {  # name preset env...
  local name=$1 preset=$2; shift 2
  env "$@" timeout 60 .gpu/bin/mlxcel bench --preset $preset --device cuda -p 512 -g 128 -r 2 --json > $OUT/$name.json 2>> $OUT/bench.err
  echo "$name $(grep -o '"decode_tps_mean"[^,]*' $OUT/$name.json) $(grep -o '"decode_tps_std"[^,]*' $OUT/$name.json) $(grep -o '"prefill_tps_mean"[^,]*' $OUT/$name.json)"
}
bench llama llama-3.1-8b-4bit
bench llama-products-apart llama-3.1-8b-4bit MLXCEL_CUDA_FUSE_PRODUCTS=0
bench llama-rope-apart llama-3.1-8b-4bit MLXCEL_CUDA_FUSE_ROPE=0
bench llama-cuda-cores llama-3.1-8b-4bit MLXCEL_GEMV_TC=0
bench qwen05 qwen2.5-0.5b-bf16
bench qwen05-products-apart qwen2.5-0.5b-bf16 MLXCEL_CUDA_FUSE_PRODUCTS=0
bench moe qwen3-30b-a3b-4bit
bench moe-bf16 qwen3-30b-a3b-4bit MLXCEL_DTYPE=bf16
bench gemma gemma3-1b-4bit
MLXCEL_CUDA_PROFILE=1 timeout 60 .gpu/bin/mlxcel bench --preset llama-3.1-8b-4bit --device cuda -p 8 -g 16 -r 1 > $OUT/llama-profile.txt 2>&1
grep -A16 "graph 1:" $OUT/llama-profile.txt | head -17
