#!/usr/bin/env bash
# GPU, session 22 (2026-12-07), call 2; branch qkv-rope after the spill fix (tc_qgemv3_rope at
# 64 registers with no spill; call 1's build spilled 64 bytes): checks, then decode with the
# products writing the rope and caches (default here) against apart
# (MLXCEL_CUDA_FUSE_PRODUCTS_ROPE=0, = main), alternating; the llama step kernel by kernel
# (Nsight, 512-token context) both ways; the representative sweep last (two runs a preset).
# About 8 minutes warm.
source "$(dirname "$0")/common.sh"
checked_report
rlog "== dense decode: q, k, v products with the rope / apart [t=$((SECONDS - t0))]"
for i in 1 2; do
  rrun bench rope-llama8b llama-3.1-8b-4bit
  rrun bench apart-llama8b llama-3.1-8b-4bit MLXCEL_CUDA_FUSE_PRODUCTS_ROPE=0
done
for i in 1 2; do
  rrun bench rope-llama1b llama-3.2-1b-4bit
  rrun bench apart-llama1b llama-3.2-1b-4bit MLXCEL_CUDA_FUSE_PRODUCTS_ROPE=0
done
rlog "== the llama step kernel by kernel, fused and apart (512-token context) [t=$((SECONDS - t0))]"
P=512 rrun ncu_step llama-rope llama-3.1-8b-4bit
P=512 rrun ncu_step llama-apart llama-3.1-8b-4bit MLXCEL_CUDA_FUSE_PRODUCTS_ROPE=0
rlog "== sweep [t=$((SECONDS - t0))]"
# The router-norm fusion (in this build, measured slower in call 1) off: the sweep is what lands.
MLXCEL_CUDA_FUSE_NORM_PRODUCT=0 SWEEP_R=2 COMMIT=qkv-rope-91f7e5c rrun sweep
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
