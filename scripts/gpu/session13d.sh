#!/usr/bin/env bash
# GPU, 2026-12-06 (13), fourth call: the per-head decode attention's split kernel requests a
# warp's keys and values four at a time before using any (ATT_U); the loads-first dense GEMVs
# without the 64-register cap (call 3: slower with it). Checks in full, then side by side with
# call 3's build (.gpu/old: HEAD before this change, its PTX alongside): qwen3-30b-a3b (groups of
# 8: the per-head kernel, its only change), qwen2.5-0.5b (attention and the cap), and the 0.5B
# on the warp-a-row kernels (MLXCEL_DENSE_SK=0); Nsight's step of the 0.5B.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
checks_in_full
echo "== side by side [t=$((SECONDS - t0))]"
for r in 1 2; do
  bench "new-q05-$r" qwen2.5-0.5b-bf16
  old "old-q05-$r" qwen2.5-0.5b-bf16
  bench "warp-q05-$r" qwen2.5-0.5b-bf16 MLXCEL_DENSE_SK=0
  bench "new-moe-$r" qwen3-30b-a3b-4bit
  old "old-moe-$r" qwen3-30b-a3b-4bit
done
echo "[t=$((SECONDS - t0))]"
SKIP=1500 COUNT=1500 ncu_step qwen05 qwen2.5-0.5b-bf16
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
