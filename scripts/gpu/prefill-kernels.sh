#!/usr/bin/env bash
# GPU: where a 512-token prefill's time goes, kernel by kernel (Nsight Compute, duration only,
# no cache flush), for the presets named (default llama-3.1-8b-4bit and qwen3-30b-a3b-4bit):
# `bench -p 512 -g 1 -r 1` is a warm-up and one measured run, so the sums are halved
# (run_kernels.py --runs 2). Into $OUT/prefill-PRESET.md, printed.
source "$(dirname "$0")/common.sh"
unpack_ptx
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for p in ${PRESETS:-llama-3.1-8b-4bit qwen3-30b-a3b-4bit}; do
  timeout 200 $ncu --csv --metrics gpu__time_duration.sum --cache-control none --clock-control none \
    --log-file /tmp/ncu-prefill-$p.csv .gpu/bin/mlxcel bench --preset $p --device cuda -p 512 -g 1 -r 1 \
    > /tmp/prefill-$p.txt 2>> /tmp/ncu.err
  echo "== prefill kernels $p rc=$?"
  python3 scripts/gpu/run_kernels.py /tmp/ncu-prefill-$p.csv --runs 2 > $OUT/prefill-$p.md 2>&1
  head -30 $OUT/prefill-$p.md
done
tail -3 /tmp/ncu.err
