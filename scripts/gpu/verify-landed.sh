#!/usr/bin/env bash
# GPU, first call of a session: correctness (op cases, fused patterns, parity) of what landed
# since the last GPU run, the representative sweep, and each recent change off side by side:
# both RoPE fusions (MLXCEL_CUDA_FUSE_ROPE=0), for Gemma the tensor-core GEMV (its 1152-wide
# products need the half-chunk path), and the MoE router and combine fusions. One file back:
# $OUT/report.txt.
# Stage as scripts/gpu/README.md says (the PTX precompiled into .gpu/extra too).
source "$(dirname "$0")/common.sh"
{
gpu_checks
sweep
bench llama-rope-apart llama-3.1-8b-4bit MLXCEL_CUDA_FUSE_ROPE=0
bench qwen05-rope-apart qwen2.5-0.5b-bf16 MLXCEL_CUDA_FUSE_ROPE=0
bench gemma-cuda-cores gemma3-1b-4bit MLXCEL_GEMV_TC=0
bench moe-router-apart qwen3-30b-a3b-4bit MLXCEL_CUDA_FUSE_ROUTER=0
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
