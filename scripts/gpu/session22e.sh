#!/usr/bin/env bash
# GPU, session 22 (2026-12-07), call 3; branch dense-rope: the dense q, k and v products
# (loads-first GEMV) writing their rope and cache writes too (dsk_gemv3_rope): checks (its
# fusion cases among them), then qwen2.5-0.5b-bf16 decode against
# MLXCEL_CUDA_FUSE_PRODUCTS_ROPE=0, alternating. About 2 minutes warm.
source "$(dirname "$0")/common.sh"
checked_report
rlog "== qwen2.5-0.5b: dense products with the rope / apart [t=$((SECONDS - t0))]"
for i in 1 2; do
  rrun bench rope-q05 qwen2.5-0.5b-bf16
  rrun bench apart-q05 qwen2.5-0.5b-bf16 MLXCEL_CUDA_FUSE_PRODUCTS_ROPE=0
done
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
