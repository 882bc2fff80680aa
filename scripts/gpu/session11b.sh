#!/usr/bin/env bash
# GPU, 2026-12-06 (11), second call: checks; the split kernels' merge with a warp a row (no
# block barriers) against the combine launch (MLXCEL_ATT_MERGE=0); on llama-3.1-8b the switches
# that bear on the tensor-core GEMV (programmatic launch, the ring, 8 warps a block, the add +
# RMSNorm as its own kernel, tile-packed weights); on the small presets programmatic launch and
# fewer attention splits (MLXCEL_ATT_FILL); then the llama step kernel by kernel.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
checks_in_full
echo "== llama [t=$((SECONDS - t0))]"
p=llama-3.1-8b-4bit
bench default $p
bench nomerge $p MLXCEL_ATT_MERGE=0
bench pdl $p MLXCEL_PDL=1
bench ring4pdl $p MLXCEL_TC_RING=4 MLXCEL_PDL=1
bench warps8 $p MLXCEL_TC_WARPS=8
bench nonorm $p MLXCEL_CUDA_FUSE_NORM=0
bench pack $p MLXCEL_TC_PACK=1
echo "== small presets [t=$((SECONDS - t0))]"
for p in smollm2-135m-4bit qwen2.5-0.5b-bf16 llama-3.2-1b-4bit; do
  bench "default-$p" $p
  bench "nomerge-$p" $p MLXCEL_ATT_MERGE=0
  bench "pdl-$p" $p MLXCEL_PDL=1
  bench "fill132-$p" $p MLXCEL_ATT_FILL=132
done
bench default-moe qwen3-30b-a3b-4bit
bench nomerge-moe qwen3-30b-a3b-4bit MLXCEL_ATT_MERGE=0
echo "== step kernels [t=$((SECONDS - t0))]"
ncu_step llama llama-3.1-8b-4bit
echo "[t=$((SECONDS - t0))]"
grep -v "^run\|^warm" /tmp/bench.err | tail -5
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
