#!/usr/bin/env bash
# GPU: what bounds the batch-1 tensor-core GEMV. Correctness of what landed (op cases, fused
# patterns, parity), the GEMV table (gpu-test gemv_throughput), Nsight Compute with every warp
# stall reason on the LM head, down projection and fused GLU, the batch-1 llama-3.1-8b profile
# by kernel, and serve's batched step at 64 rows. One file back: $OUT/report.txt (+ ncu-*.txt).
source "$(dirname "$0")/common.sh"
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
{
gpu_checks
echo "== gemv table"; timeout 120 .gpu/tests/gpu-test gemv_throughput --ignored --nocapture 2>&1 | grep "^|"
for spec in "lm head:tc_qgemv_f16_4" "down proj:tc_qgemv_f16_4" "gate+up (fused GLU):tc_qglu_f16_4" "q/o proj:tc_qgemv_f16_4"; do
  shape=${spec%%:*}; k=${spec##*:}; f=$OUT/ncu-${shape%% *}.txt
  MLXCEL_GEMV_SHAPES="$shape" timeout 100 $ncu --clock-control none -k regex:"^$k(_r0)?\$" --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats \
    --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio,dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum \
    .gpu/tests/gpu-test gemv_throughput --ignored --nocapture > $f 2>&1
  echo "== ncu $shape ($k) rc=$?"
  grep -E "^  [a-z_]+ |Duration|DRAM Throughput|L2 Hit|Registers Per|Block Size|Grid Size|Achieved Occupancy|Theoretical Occupancy|Issued Warp|No Eligible|Warp Cycles Per Issued|dram__bytes|lts__t_sectors|stalled" $f | grep -v " 0$\| 0\.0[0-9]$" | head -40
done
MLXCEL_CUDA_PROFILE=1 timeout 90 .gpu/bin/mlxcel bench --preset llama-3.1-8b-4bit --device cuda -p 64 -g 32 -r 1 > $OUT/profile-b1.txt 2>&1
echo "== profile batch 1 rc=$?"; grep -v "^\s*$" $OUT/profile-b1.txt | head -30
bench llama llama-3.1-8b-4bit
batch 64
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
