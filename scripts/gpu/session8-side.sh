#!/usr/bin/env bash
# GPU, 2026-12-04 (8), third call: the build before the load changes (.gpu/old) and after, side
# by side on six presets and serve's 64-row step, then each decode step's kernels (Nsight
# Compute) after. Both builds' PTX is JIT-compiled by the driver once first, in parallel (about
# a minute each; the second call lost its old runs to that under a 60 s timeout).
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
(timeout 240 .gpu/old/mlxcel bench --preset llama-3.2-1b-4bit --device cuda -p 16 -g 4 -r 1 > /dev/null 2> /tmp/warm-old.err; echo "old warm rc=$?") &
timeout 240 .gpu/bin/mlxcel bench --preset llama-3.2-1b-4bit --device cuda -p 16 -g 4 -r 1 > /dev/null 2> /tmp/warm-new.err; echo "new warm rc=$?"
wait
echo "== side by side [t=$((SECONDS - t0))]"
for p in llama-3.1-8b-4bit qwen3-30b-a3b-4bit qwen3-8b-4bit gemma3-1b-4bit llama-3.2-1b-4bit qwen2.5-0.5b-bf16; do
  old old-$p $p; bench new-$p $p
done
echo "== 64-row step [t=$((SECONDS - t0))]"
env MLXCEL_X=1 timeout 90 .gpu/old/mlxcel bench --preset llama-3.1-8b-4bit --device cuda --batch 64 -p 256 -g 64 -r 2 --json > /tmp/ob.json 2>> /tmp/bench.err
echo "old batch 64 $(grep -o '"aggregate_tps_mean"[^,]*' /tmp/ob.json)"
batch 64
echo "== step kernels [t=$((SECONDS - t0))]"
ncu_step moe qwen3-30b-a3b-4bit
ncu_step llama llama-3.1-8b-4bit
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err /tmp/warm-old.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
