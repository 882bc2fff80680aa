#!/usr/bin/env bash
# GPU: correctness (op cases, fused patterns, parity), then decode side by side with each of the
# small-kernel changes off (grouped-query attention and its split count, norm inside the GEMV,
# GEMV blocks looping over tiles), the other presets,
# and a profile of the 8B step at the bench's context length. One file back: $OUT/report.txt.
# (MLXCEL_ATT_GQA_BLOCKS was removed after this measurement: the grouped kernel now splits by
# keys alone, as the `gqa-by-keys` lines measured, so those lines now run the defaults.)
source "$(dirname "$0")/common.sh"
R=$OUT/report.txt
{
gpu_checks
bench llama llama-3.1-8b-4bit
bench llama-block-a-tile llama-3.1-8b-4bit MLXCEL_TC_PERSIST=0
bench llama-norm-apart llama-3.1-8b-4bit MLXCEL_CUDA_FUSE_NORM=0
bench llama-block-a-tile-norm-apart llama-3.1-8b-4bit MLXCEL_TC_PERSIST=0 MLXCEL_CUDA_FUSE_NORM=0
bench llama-att-per-head llama-3.1-8b-4bit MLXCEL_ATT_GQA=0
bench qwen3 qwen3-8b-4bit
bench qwen05 qwen2.5-0.5b-bf16
bench qwen05-att-per-head qwen2.5-0.5b-bf16 MLXCEL_ATT_GQA=0
bench qwen05-gqa-by-keys qwen2.5-0.5b-bf16 MLXCEL_ATT_GQA_BLOCKS=1
bench qwen05-gqa-264 qwen2.5-0.5b-bf16 MLXCEL_ATT_GQA_BLOCKS=264
bench moe qwen3-30b-a3b-4bit
bench gemma gemma3-1b-4bit
bench gemma-att-per-head gemma3-1b-4bit MLXCEL_ATT_GQA=0
bench gemma-gqa-by-keys gemma3-1b-4bit MLXCEL_ATT_GQA_BLOCKS=1
tail -3 /tmp/bench.err
MLXCEL_CUDA_PROFILE=1 timeout 60 .gpu/bin/mlxcel bench --preset llama-3.1-8b-4bit --device cuda -p 512 -g 32 -r 1 > /tmp/prof.txt 2>&1
grep -A16 "graph 1:" /tmp/prof.txt | head -17
} > $R 2>&1
cat $R
