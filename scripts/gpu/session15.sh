#!/usr/bin/env bash
# GPU, 2026-12-06 (15), first call after attention_lanes became the default per-head decode
# attention: the default checks (timed: the staged cubin should spare the driver's 70 s compile
# on a cold machine); then the per-head lanes kernel against the grouped one on the presets
# whose decode attention is grouped (llama-3.1-8b and qwen3-8b: 4 heads a group, 128 wide;
# gemma3-1b and its Llama twin: 4 a group, 256 wide), at batch 1 and in serve's 64-row step;
# then Nsight steps: serve's 64-row step, the MoE preset, the 8B.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
echo "== default checks (cache: $(ls $MLXCEL_CACHE_DIR))"
checks_in_full
echo "== grouped (default) against per-head lanes (MLXCEL_ATT_GQA=0) [t=$((SECONDS - t0))]"
for p in llama-3.1-8b-4bit qwen3-8b-4bit gemma3-1b-4bit llama-as-gemma3-1b-4bit; do
  bench "$p-gqa" $p
  bench "$p-lanes" $p MLXCEL_ATT_GQA=0
done
bench "gemma3-1b-4bit-gqa-2" gemma3-1b-4bit
bench "llama-as-gemma3-1b-4bit-gqa-2" llama-as-gemma3-1b-4bit
bench "q05" qwen2.5-0.5b-bf16
bench "moe" qwen3-30b-a3b-4bit
echo "== serve's 64-row step [t=$((SECONDS - t0))]"
batch 64
batch 64 MLXCEL_ATT_GQA=0
echo "== steps [t=$((SECONDS - t0))]"
ncu_batch batch64 64
ncu_step moe qwen3-30b-a3b-4bit
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
