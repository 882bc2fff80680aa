#!/usr/bin/env bash
# GPU, 2026-12-06 (11), first call: checks (failures in full); the decode attention's split
# kernels merging their own partials (MLXCEL_ATT_MERGE=0: the combine launch as before) and the
# tensor-core GEMV for k a multiple of 64 (SmolLM2's 576 and 1536, with the add + RMSNorm and
# q/k/v folded in), against the build before them (.gpu/old: binary, gzipped PTX) side by side;
# then each kernel of the SmolLM2-shaped and the llama-3.1-8b steps (Nsight Compute).
# Stage, prune .gpu/tests to gpu-test and parity_cuda-test, add .gpu/extra/ptx-*.ptx.gz and
# .gpu/old; carry [".gpu"].
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
checks_in_full
echo "== side by side [t=$((SECONDS - t0))]"
for p in smollm2-135m-4bit qwen2.5-0.5b-bf16 llama-3.2-1b-4bit llama-3.1-8b-4bit qwen3-30b-a3b-4bit; do
  old "old-$p" $p
  bench "new-$p" $p
  bench "nomerge-$p" $p MLXCEL_ATT_MERGE=0
done
echo "== step kernels [t=$((SECONDS - t0))]"
ncu_step smollm2 smollm2-135m-4bit
ncu_step llama llama-3.1-8b-4bit
tail -3 /tmp/ncu.err
echo "[t=$((SECONDS - t0))]"
tail -5 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
