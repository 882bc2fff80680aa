#!/usr/bin/env bash
# GPU, 2026-12-07 (18), second call: Nsight's warp-stall reasons for the batch-1 tensor-core
# GEMV and GLU (after the dequantization change); llama-3.1-8b with 2, 8 and 16 warps a
# tensor-core block; the representative sweep of six presets.
# About 6 minutes warm.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
echo "== batch-1 stalls"
ncu_stalls tc_qglu_f16_4 tc_qgemv_f16_4
echo "== llama-3.1-8b by tensor-core warps a block (default: as many as keep ~32 an SM) [t=$((SECONDS - t0))]"
bench default llama-3.1-8b-4bit
for w in 2 8 16; do bench warps$w llama-3.1-8b-4bit MLXCEL_TC_WARPS=$w; done
echo "== sweep [t=$((SECONDS - t0))]"
COMMIT=$(cat .gpu/extra/commit 2>/dev/null || echo wip) sweep
echo "[t=$((SECONDS - t0))]"
} > $OUT/report.txt 2>&1
cp /tmp/sweep.md $OUT/ 2>/dev/null
cat $OUT/report.txt
