#!/usr/bin/env bash
# GPU: where a 512-token prefill's time goes, kernel by kernel (Nsight Compute, duration only,
# no cache flush), for the presets named (default llama-3.1-8b-4bit and qwen3-30b-a3b-4bit):
# `bench -p 512 -g 1 -r 1` is a warm-up and one measured run, so the sums are halved
# (run_kernels.py --runs 2). Into $OUT/prefill-PRESET.md, printed.
source "$(dirname "$0")/common.sh"
unpack_ptx
for p in ${PRESETS:-llama-3.1-8b-4bit qwen3-30b-a3b-4bit}; do
  prefill_kernels $p
done
tail -3 /tmp/ncu.err
