#!/usr/bin/env bash
# GPU, 2026-12-07 (21), first call: the MoE router with its product and the add + RMSNorm before
# it in one launch (index.cu moe_router) and the routed down product with the combine after it
# (gemv.cu tc_gather_qgemv_*_combine) checked, then measured against each turned off
# (MLXCEL_CUDA_FUSE_ROUTER_PRODUCT=0, MLXCEL_CUDA_FUSE_COMBINE=0) on the MoE preset, alternating;
# four warps a tensor-core GEMV block as a data point; the MoE step kernel by kernel at a
# 512-token context; the representative sweep. About 5 minutes warm.
source "$(dirname "$0")/common.sh"
checked_report
rlog "== decode: both fused, router product apart, combine apart, both apart [t=$((SECONDS - t0))]"
for i in 1 2 3; do
  rrun bench new-moe qwen3-30b-a3b-4bit
  rrun bench router0-moe qwen3-30b-a3b-4bit MLXCEL_CUDA_FUSE_ROUTER_PRODUCT=0
  rrun bench combine0-moe qwen3-30b-a3b-4bit MLXCEL_CUDA_FUSE_COMBINE=0
  rrun bench both0-moe qwen3-30b-a3b-4bit MLXCEL_CUDA_FUSE_ROUTER_PRODUCT=0 MLXCEL_CUDA_FUSE_COMBINE=0
done
rrun bench warps4-moe qwen3-30b-a3b-4bit MLXCEL_TC_WARPS=4
rlog "== MoE step kernel by kernel, 512-token context [t=$((SECONDS - t0))]"
P=512 rrun ncu_step moe qwen3-30b-a3b-4bit
rlog "== sweep [t=$((SECONDS - t0))]"
rrun sweep
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
