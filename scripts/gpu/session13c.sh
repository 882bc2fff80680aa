#!/usr/bin/env bash
# GPU, 2026-12-06 (13), third call: the loads-first dense GEMVs capped at 64 registers (four
# blocks an SM), and Gemma's sandwich norms computed inside the GEMV that reads the add + RMSNorm
# after them (gemma3-1b: 267 → 216 launches a step). Checks in full (new op cases: the sandwich
# into 4-bit products and a dense GLU; the fixed dense case), then decode side by side:
# qwen2.5-0.5b against the warp-a-row kernels (MLXCEL_DENSE_SK=0), gemma3-1b against the
# sandwich norms as their own launches (MLXCEL_CUDA_FUSE_SANDWICH=0); Nsight's step of the 0.5B.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
checks_in_full
echo "== side by side [t=$((SECONDS - t0))]"
for r in 1 2; do
  bench "dsk-$r" qwen2.5-0.5b-bf16
  bench "warp-$r" qwen2.5-0.5b-bf16 MLXCEL_DENSE_SK=0
  bench "sandwich-$r" gemma3-1b-4bit
  bench "apart-$r" gemma3-1b-4bit MLXCEL_CUDA_FUSE_SANDWICH=0
done
echo "[t=$((SECONDS - t0))]"
SKIP=1500 COUNT=1500 ncu_step qwen05 qwen2.5-0.5b-bf16
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
