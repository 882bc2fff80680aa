#!/usr/bin/env bash
# GPU, 2026-12-06 (12), sixth call: Qwen3's and Gemma 3's per-head q and k RMSNorms inside the
# rope-and-write launch (two launches a layer fewer). Checks in full (the fold's op cases in
# gpu-test; parity_cuda runs the qwen3, qwen3_moe and gemma3 fixtures), then decode side by side
# against the norms as their own kernels (MLXCEL_CUDA_FUSE_QK_NORM=0). Stage as for session12.sh.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
checks_in_full
echo "== side by side [t=$((SECONDS - t0))]"
for p in qwen3-8b-4bit gemma3-1b-4bit qwen3-30b-a3b-4bit; do
  bench "fold-$p" $p
  bench "apart-$p" $p MLXCEL_CUDA_FUSE_QK_NORM=0
done
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
