#!/usr/bin/env bash
# GPU: op cases (top-k kernel), bench of the final defaults, Nsight Compute on the GEMV, MoE profile.
cd "$(dirname "$0")/../.."
lib=$(dirname "$(find / -name 'libcublas.so.1*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}" MLXCEL_CACHE_DIR=/tmp/mlxcel-cache MLXCEL_TEST_ROOT=$PWD
MLXCEL_REQUIRE_CUDA=1 timeout 150 .gpu/tests/gpu-test --test-threads 1 --skip every_kernel > $OUT/tests.txt 2>&1; echo "gpu-test rc=$?"
MLXCEL_REQUIRE_CUDA=1 timeout 60 .gpu/tests/parity_cuda-test > $OUT/parity.txt 2>&1; echo "parity rc=$?"
grep -E "test result|differ|panicked" $OUT/tests.txt $OUT/parity.txt | head
MLXCEL=.gpu/bin/mlxcel MLXCEL_COMMIT=${COMMIT:-wip} timeout 150 bash scripts/bench_representative.sh -o $OUT/bench.md --only llama-3.1-8b-4bit,qwen2.5-0.5b-bf16,qwen3-30b-a3b-4bit -- --device cuda -p 512 -g 128 -r 3 2> $OUT/bench.err >/dev/null
cat $OUT/bench.md
MLXCEL_CUDA_PROFILE=1 timeout 60 .gpu/bin/mlxcel bench --preset qwen3-30b-a3b-4bit --device cuda -p 8 -g 16 -r 1 > $OUT/moe-profile.txt 2>&1
grep -A12 "graph 1:" $OUT/moe-profile.txt | head -13
timeout 100 /usr/local/cuda/bin/ncu -k regex:"qgemv_f16_4_1_2" --launch-skip 4 --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
  .gpu/tests/gpu-test gemv_throughput --ignored --nocapture > $OUT/ncu.txt 2>&1
echo "ncu rc=$?"; grep -E "Duration|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Stall|Warp Cycles Per Issued|Issued Warp|No Eligible|ERR" $OUT/ncu.txt | head -30
