#!/usr/bin/env bash
# GPU, 2026-12-06 (13), first call: Qwen2's q/k/v biases added by the fused products' launch and
# the add + RMSNorm computed inside dense GEMVs (qwen2.5-0.5b: 269 → 150 launches a step).
# Checks in full (the new op cases in gpu-test; parity_cuda's qwen2 fixtures at f16 and bf16),
# then decode side by side: default, biases apart (MLXCEL_CUDA_FUSE_BIAS=0), and biases and
# norms apart (the state before); gemma3-1b's q/k-norm gate (default: 256-wide heads apart)
# against =all, which session 12 set without a GPU; llama-3.2-1b as the control. Then Nsight's
# per-kernel step of the 0.5B. Stage: ../shared/gpu/stage, prune .gpu/tests to gpu-test and
# parity_cuda-test, the gzipped PTX cache in .gpu/extra.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
checks_in_full
echo "== side by side [t=$((SECONDS - t0))]"
for r in 1 2; do
  bench "fused-$r" qwen2.5-0.5b-bf16
  bench "bias-apart-$r" qwen2.5-0.5b-bf16 MLXCEL_CUDA_FUSE_BIAS=0
  bench "both-apart-$r" qwen2.5-0.5b-bf16 MLXCEL_CUDA_FUSE_BIAS=0 MLXCEL_CUDA_FUSE_NORM=0
done
bench "gemma-gate" gemma3-1b-4bit
bench "gemma-all" gemma3-1b-4bit MLXCEL_CUDA_FUSE_QK_NORM=all
bench "llama1b" llama-3.2-1b-4bit
echo "[t=$((SECONDS - t0))]"
SKIP=1500 COUNT=1500 ncu_step qwen05 qwen2.5-0.5b-bf16
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
