#!/usr/bin/env bash
# GPU, session 22 (2026-12-07), call 1; branch qkv-rope (router-norm with main merged, and the
# q, k, v products writing their rope and cache writes, tc_qgemv3_rope): checks (the new fusion
# cases among them), then decode, alternating, three rounds:
# - qwen3-30b-a3b: the router's norm in its product (default here), apart
#   (MLXCEL_CUDA_FUSE_NORM_PRODUCT=0, = main), apart with the old 8 warps a GLU block (main
#   before 0087eb0);
# - llama-3.1-8b and llama-3.2-1b: the products with the rope (default here) and apart
#   (MLXCEL_CUDA_FUSE_PRODUCTS_ROPE=0, = main);
# then the batch-1 GLU's and product's instruction mix. About 8 minutes warm.
source "$(dirname "$0")/common.sh"
checked_report
rlog "== MoE decode: normed router product / apart / apart with 8 GLU warps [t=$((SECONDS - t0))]"
for i in 1 2 3; do
  rrun bench normed-moe qwen3-30b-a3b-4bit
  rrun bench apart-moe qwen3-30b-a3b-4bit MLXCEL_CUDA_FUSE_NORM_PRODUCT=0
  rrun bench glu8-moe qwen3-30b-a3b-4bit MLXCEL_CUDA_FUSE_NORM_PRODUCT=0 MLXCEL_GATHER_GLU_WARPS=8
done
rlog "== dense decode: q, k, v products with the rope / apart [t=$((SECONDS - t0))]"
for p in llama-3.1-8b-4bit llama-3.2-1b-4bit; do
  for i in 1 2 3; do
    rrun bench rope-$p $p
    rrun bench apart-$p $p MLXCEL_CUDA_FUSE_PRODUCTS_ROPE=0
  done
done
rlog "== the batch-1 products' instruction mix [t=$((SECONDS - t0))]"
rrun ncu_mix tc_qglu_f16_4 tc_qgemv_f16_4
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
