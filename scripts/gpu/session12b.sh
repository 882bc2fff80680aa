#!/usr/bin/env bash
# GPU, 2026-12-06 (12), second call: the grouped routed products a block a tile of one
# expert's pairs (moe_sort cuts the tiles), not a block an expert: checks (failures in full);
# qwen3-30b-a3b prefill with grouped_rows (64 or 32 pairs a tile, MLXCEL_MOE_ROWS=4) against
# grouped_qmm (MLXCEL_MOE_ROWS=0), side by side; Nsight Compute on the first layer's three
# grouped launches and three of layer 30 (does routing in deep layers of the random model crowd
# onto few experts?). Stage as for session12.sh.
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
echo "== ncu [t=$((SECONDS - t0))]"
ncu=$(ncu_bin)
for skip in 0 90; do
  timeout 100 $ncu -k regex:"^grouped_rows" --launch-skip $skip --launch-count 3 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
    .gpu/bin/mlxcel bench --preset qwen3-30b-a3b-4bit --device cuda -p 512 -g 2 -r 1 > $OUT/ncu-grouped-$skip.txt 2>&1
  echo "== ncu skip $skip rc=$?"
  grep -E "  grouped_rows|Duration|DRAM Throughput|Achieved Occupancy|Warp Cycles Per Issued|Issued Warp Per|No Eligible" $OUT/ncu-grouped-$skip.txt | head -30
done
echo "[t=$((SECONDS - t0))]"
tail -5 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
