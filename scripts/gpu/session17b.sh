#!/usr/bin/env bash
# GPU, 2026-12-06 (17), second call: what stalls the batch-1 tensor-core GEMVs (Nsight's warp
# stall reasons per issued instruction for tc_qglu and tc_qgemv in gpu-test gemv_throughput's
# llama-3.1-8b shapes), and decode of the two 8B presets with this build. About 4 minutes warm.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
ncu=$(ncu_bin)
for k in tc_qglu_f16_4 tc_qgemv_f16_4; do
  timeout 120 $ncu -k regex:"^$k\$" --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --metrics regex:'smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
    .gpu/tests/gpu-test gemv_throughput --ignored --nocapture > $OUT/ncu-stalls-$k.txt 2>&1
  echo "== ncu $k rc=$? [t=$((SECONDS - t0))]"
  grep -E "Duration|DRAM Throughput|Registers Per|Block Size|Grid Size|Achieved Occupancy|Warp Cycles Per Issued|Issued Warp|Eligible Warps" $OUT/ncu-stalls-$k.txt | head -12
  grep -E "issue_stalled" $OUT/ncu-stalls-$k.txt | sort -k3 -g -r | head -8
done
echo "== decode [t=$((SECONDS - t0))]"
bench llama8b llama-3.1-8b-4bit
bench qwen3-8b qwen3-8b-4bit
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
