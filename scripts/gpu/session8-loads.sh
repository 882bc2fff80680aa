#!/usr/bin/env bash
# GPU, 2026-12-04 (8), second call: loads issued together (ldf without branches, scales with the
# GEMV's weights, attention's keys and values in flight together) against the build before it
# (.gpu/old: the same presets side by side in this call), correctness first, then each decode
# step's kernels timed by Nsight Compute. $OUT/report.txt + step tables.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
gpu_checks
grep -E "^test .*(FAILED|failed)|panicked" /tmp/tests.txt /tmp/parity.txt | head
echo "== bench, before (old) and after [t=$((SECONDS - t0))]"
for p in llama-3.1-8b-4bit qwen3-30b-a3b-4bit qwen3-8b-4bit llama-3.2-1b-4bit gemma3-1b-4bit qwen2.5-0.5b-bf16; do
  old old-$p $p; bench new-$p $p
done
echo "== switches [t=$((SECONDS - t0))]"
bench llama-pdl llama-3.1-8b-4bit MLXCEL_PDL=1
bench llama-online llama-3.1-8b-4bit MLXCEL_ATT_ONLINE=1
bench moe-pdl qwen3-30b-a3b-4bit MLXCEL_PDL=1
batch 64
echo "== step kernels [t=$((SECONDS - t0))]"
ncu_step llama llama-3.1-8b-4bit
ncu_step moe qwen3-30b-a3b-4bit
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
