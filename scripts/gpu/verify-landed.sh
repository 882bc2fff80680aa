#!/usr/bin/env bash
# GPU, first call of a session: correctness (op cases, fused patterns, parity) of what landed
# since the last GPU run, the representative sweep, and each recent change off side by side:
# both RoPE fusions (MLXCEL_CUDA_FUSE_ROPE=0), for Gemma the tensor-core GEMV (its 1152-wide
# products need the half-chunk path), and the MoE router and combine fusions. One file back:
# $OUT/report.txt.
#
# Staging here first (the call carries at most 64 MiB):
#   ../shared/gpu/stage
#   (cd .gpu/tests && ls | grep -v -E '^(gpu-test|parity_cuda-test)$' | xargs rm -f)
#   rm -f .gpu/extra/ptx-*; MLXCEL_CACHE_DIR=$PWD/.gpu/extra cargo test --release --features cuda \
#     -p mlxcel-cuda --test gpu write_kernel_cache -- --ignored   # PTX for the cold GPU (NVRTC here)
# then: run with carry [".gpu"], command "bash scripts/gpu/verify-landed.sh".
cd "$(dirname "$0")/../.."
lib=$(dirname "$(find / -name 'libcublas.so.1*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}" MLXCEL_CACHE_DIR=/tmp/mlxcel-cache MLXCEL_TEST_ROOT=$PWD
mkdir -p "$MLXCEL_CACHE_DIR"; cp .gpu/extra/ptx-*.ptx "$MLXCEL_CACHE_DIR"/ 2>/dev/null
{
MLXCEL_REQUIRE_CUDA=1 timeout 150 .gpu/tests/gpu-test --test-threads 1 --skip every_kernel > /tmp/tests.txt 2>&1; echo "gpu-test rc=$?"
grep -E "test result|differ|panicked|FAIL|mismatch|case" /tmp/tests.txt | head -30
MLXCEL_REQUIRE_CUDA=1 timeout 60 .gpu/tests/parity_cuda-test > /tmp/parity.txt 2>&1; echo "parity rc=$?"
grep -E "test result|panicked|FAIL" /tmp/parity.txt | head
MLXCEL=.gpu/bin/mlxcel MLXCEL_COMMIT=${COMMIT:-wip} timeout 200 bash scripts/bench_representative.sh -o /tmp/sweep.md \
  --only llama-3.1-8b-4bit,qwen3-8b-4bit,qwen3-30b-a3b-4bit,qwen2.5-0.5b-bf16,gemma3-1b-4bit -- --device cuda -p 512 -g 128 -r 3 2> /tmp/bench.err >/dev/null
cat /tmp/sweep.md; tail -2 /tmp/bench.err
bench() {  # name preset env...
  local name=$1 preset=$2; shift 2
  env "$@" timeout 60 .gpu/bin/mlxcel bench --preset $preset --device cuda -p 512 -g 128 -r 2 --json > /tmp/$name.json 2>> /tmp/bench.err
  echo "$name $(grep -o '"decode_tps_mean"[^,]*' /tmp/$name.json) $(grep -o '"decode_tps_std"[^,]*' /tmp/$name.json)"
}
bench llama-rope-apart llama-3.1-8b-4bit MLXCEL_CUDA_FUSE_ROPE=0
bench qwen05-rope-apart qwen2.5-0.5b-bf16 MLXCEL_CUDA_FUSE_ROPE=0
bench gemma-cuda-cores gemma3-1b-4bit MLXCEL_GEMV_TC=0
bench moe-router-apart qwen3-30b-a3b-4bit MLXCEL_CUDA_FUSE_ROUTER=0
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
