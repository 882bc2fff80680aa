#!/usr/bin/env bash
# GPU, 2026-12-06 (12), fifth call: moe_sort with its expert scans by warp shuffles (thread 0
# walked the experts alone: 13.8 us a launch with tiles). Checks in full (parity twice), then
# qwen3-30b-a3b prefill against grouped_qmm, and its prefill kernels (Nsight Compute). Stage as
# for session12.sh.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
PARITY_RUNS=2 checks_in_full
echo "== moe [t=$((SECONDS - t0))]"
bench moe-1 qwen3-30b-a3b-4bit
bench moe-qmm qwen3-30b-a3b-4bit MLXCEL_MOE_ROWS=0
bench moe-2 qwen3-30b-a3b-4bit
echo "== prefill kernels [t=$((SECONDS - t0))]"
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
p=qwen3-30b-a3b-4bit
timeout 200 $ncu --csv --metrics gpu__time_duration.sum --cache-control none --clock-control none \
  --log-file /tmp/ncu-prefill-$p.csv .gpu/bin/mlxcel bench --preset $p --device cuda -p 512 -g 1 -r 1 \
  > /tmp/prefill-$p.txt 2>> /tmp/ncu.err
echo "== prefill kernels $p rc=$?"
python3 scripts/gpu/run_kernels.py /tmp/ncu-prefill-$p.csv --runs 2 > $OUT/prefill-$p.md 2>&1
head -26 $OUT/prefill-$p.md
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/ncu.err; tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
