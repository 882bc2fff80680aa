#!/usr/bin/env bash
# GPU, session 23 (2026-12-07), call 1; branch dense-rope: session22e.sh's checks and
# qwen2.5-0.5b-bf16 decode with the dense products writing their rope (against
# MLXCEL_CUDA_FUSE_PRODUCTS_ROPE=0, alternating), then the representative sweep (2 runs each)
# as this session's baseline on whichever card came.
source "$(dirname "$0")/common.sh"
checked_report
rlog "== qwen2.5-0.5b: dense products with the rope / apart [t=$((SECONDS - t0))]"
for i in 1 2; do
  rrun bench rope-q05 qwen2.5-0.5b-bf16
  rrun bench apart-q05 qwen2.5-0.5b-bf16 MLXCEL_CUDA_FUSE_PRODUCTS_ROPE=0
done
rlog "== sweep [t=$((SECONDS - t0))]"
SWEEP_R=2 rrun sweep
cp /tmp/sweep.md $OUT/sweep.md 2>/dev/null
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
