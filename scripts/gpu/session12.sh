#!/usr/bin/env bash
# GPU, 2026-12-06 (12), first call: checks (failures in full); MoE prefill with the routed
# products on qmm_rows's blocks (grouped_rows, 64 or 32 pairs a pass) against grouped_qmm
# (MLXCEL_MOE_ROWS=0), side by side; the prefill's kernel profile; Nsight Compute on one
# grouped_rows launch of each shape. Stage, prune .gpu/tests to gpu-test and parity_cuda-test,
# add .gpu/extra/ptx-*.ptx.gz; carry [".gpu"].
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
checks_in_full
echo "== moe prefill side by side [t=$((SECONDS - t0))]"
for r in 1 2; do
  bench "rows8-$r" qwen3-30b-a3b-4bit
  bench "rows4-$r" qwen3-30b-a3b-4bit MLXCEL_MOE_ROWS=4
  bench "qmm-$r" qwen3-30b-a3b-4bit MLXCEL_MOE_ROWS=0
done
bench qwen3-8b qwen3-8b-4bit
echo "== profile [t=$((SECONDS - t0))]"
MLXCEL_CUDA_PROFILE=1 timeout 90 .gpu/bin/mlxcel bench --preset qwen3-30b-a3b-4bit --device cuda -p 512 -g 4 -r 2 > $OUT/profile-moe.txt 2>&1
echo "== profile rc=$?"; grep -A16 "graph 0" $OUT/profile-moe.txt | head -40
echo "== ncu [t=$((SECONDS - t0))]"
ncu=$(ncu_bin)
timeout 150 $ncu -k regex:"^grouped_rows" --launch-skip 0 --launch-count 3 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
  --section WarpStateStats --section SchedulerStats \
  .gpu/bin/mlxcel bench --preset qwen3-30b-a3b-4bit --device cuda -p 512 -g 2 -r 1 > $OUT/ncu-grouped.txt 2>&1
echo "== ncu rc=$?"
grep -E "grouped_rows|Duration|DRAM Throughput|Memory Throughput|L2 Hit|Registers Per|Grid Size|Achieved Occupancy|Block Limit Reg|Warp Cycles Per Issued|No Eligible|Stall" $OUT/ncu-grouped.txt | head -60
echo "[t=$((SECONDS - t0))]"
tail -5 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
