#!/usr/bin/env bash
# GPU, session 22 (2026-12-07), call 1; branch router-norm with main merged (so the build has the
# routed GLU's one-round rule too): checks, then qwen3-30b-a3b decode three ways, alternating:
# the router's norm in its product (default here), apart (= main), apart with the old 8 warps a
# GLU block (main before 0087eb0); the MoE step kernel by kernel with the norm in the product; the instruction mix
# of the batch-1 GLU and product (Nsight metrics).
# About 5 minutes warm. session22d.sh follows in the next call.
source "$(dirname "$0")/common.sh"
checked_report
rlog "== MoE decode: normed router product / apart / apart with 8 GLU warps [t=$((SECONDS - t0))]"
for i in 1 2 3; do
  rrun bench normed-moe qwen3-30b-a3b-4bit
  rrun bench apart-moe qwen3-30b-a3b-4bit MLXCEL_CUDA_FUSE_NORM_PRODUCT=0
  rrun bench glu8-moe qwen3-30b-a3b-4bit MLXCEL_CUDA_FUSE_NORM_PRODUCT=0 MLXCEL_GATHER_GLU_WARPS=8
done
P=512 rrun ncu_step moe-normed qwen3-30b-a3b-4bit
rlog "== the batch-1 products' instruction mix [t=$((SECONDS - t0))]"
rrun ncu_mix tc_qglu_f16_4 tc_qgemv_f16_4
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
