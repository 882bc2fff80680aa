#!/usr/bin/env bash
# GPU: Nsight Compute on the tensor-core decode GEMVs (what bounds them), a profile of the 8B step
# at the bench's context length, then decode speed and AsType per step under native/auto/bf16.
cd "$(dirname "$0")/../.."
lib=$(dirname "$(find / -name 'libcublas.so.1*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}" MLXCEL_CACHE_DIR=/tmp/mlxcel-cache MLXCEL_TEST_ROOT=$PWD
mkdir -p "$MLXCEL_CACHE_DIR"; cp .gpu/extra/ptx-*.ptx "$MLXCEL_CACHE_DIR"/ 2>/dev/null
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
MLXCEL_CUDA_PROFILE=1 timeout 60 .gpu/bin/mlxcel bench --preset llama-3.1-8b-4bit --device cuda -p 512 -g 32 -r 1 > $OUT/llama-profile-512.txt 2>&1
grep -A16 "graph 1:" $OUT/llama-profile-512.txt | head -17
for k in tc_qglu_f16_4 tc_qgemv_f16_4 tc_qgemv3_f16_4; do
  timeout 90 $ncu -k regex:"^$k\$" --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats \
    .gpu/tests/gpu-test gemv_throughput --ignored --nocapture > $OUT/ncu-$k.txt 2>&1
  echo "== $k rc=$?"
  grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Hit|Registers Per|Block Size|Grid Size|Achieved Occupancy|Theoretical Occupancy|Block Limit|Warp Cycles Per Issued|Issued Warp|No Eligible|Stall|ERR|shape" $OUT/ncu-$k.txt | head -30
done
TESTS=0 timeout 330 bash scripts/gpu/dtype-policies.sh
