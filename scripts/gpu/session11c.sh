#!/usr/bin/env bash
# GPU, 2026-12-06 (11), third call: checks (new: rope and cache writes inside the decode
# attention's split kernels, four shapes, caches compared); side by side, the fold against
# MLXCEL_CUDA_FUSE_ROPE_ATTENTION=0 on five presets, and the default programmatic-launch policy
# (GEMVs of at most 16 MiB) against none and all; the SmolLM2-shaped step kernel by kernel.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
checks_in_full
echo "== rope fold [t=$((SECONDS - t0))]"
for p in smollm2-135m-4bit llama-3.2-1b-4bit qwen2.5-0.5b-bf16 llama-3.1-8b-4bit qwen3-30b-a3b-4bit; do
  bench "fold-$p" $p
  bench "nofold-$p" $p MLXCEL_CUDA_FUSE_ROPE_ATTENTION=0
done
echo "== programmatic launch [t=$((SECONDS - t0))]"
bench pdl0-llama-3.1-8b-4bit llama-3.1-8b-4bit MLXCEL_PDL=0
bench pdl1-llama-3.1-8b-4bit llama-3.1-8b-4bit MLXCEL_PDL=1
bench pdl0-llama-3.2-1b-4bit llama-3.2-1b-4bit MLXCEL_PDL=0
bench pdl0-smollm2-135m-4bit smollm2-135m-4bit MLXCEL_PDL=0
bench qwen3-8b qwen3-8b-4bit
bench gemma3-1b gemma3-1b-4bit
echo "== step kernels [t=$((SECONDS - t0))]"
ncu_step smollm2 smollm2-135m-4bit
echo "[t=$((SECONDS - t0))]"
grep -v "^run\|^warm" /tmp/bench.err | tail -5
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
