#!/usr/bin/env bash
# GPU: correctness under each GEMV variant, GEMV throughput by variant, the bench sweep, attention splits, a profile.
cd "$(dirname "$0")/../.."
lib=$(dirname "$(find / -name 'libcublas.so.1*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}" MLXCEL_TEST_ROOT=$PWD MLXCEL_CACHE_DIR=/tmp/mlxcel-cache
for t in .gpu/tests/*; do
  echo "=== $t" >> $OUT/tests.txt
  MLXCEL_REQUIRE_CUDA=1 timeout 240 "$t" --test-threads 1 --skip every_kernel_compiles >> $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt
done
for v in "MLXCEL_GEMV_R=2" "MLXCEL_GEMV_R=4" "MLXCEL_GEMV_SMEM=1"; do  # every op case under each kernel variant too
  echo "=== gpu-test with $v" >> $OUT/tests.txt
  env $v MLXCEL_REQUIRE_CUDA=1 timeout 120 .gpu/tests/gpu-test --test-threads 1 --skip every_kernel_compiles >> $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt
done
grep -E "^=== |rc=|test result|differ|FAILED|panicked" $OUT/tests.txt | head -40
ls /usr/local/cuda*/bin 2>/dev/null | head -30 > $OUT/tools.txt; which nsys ncu >> $OUT/tools.txt 2>&1
g=.gpu/tests/gpu-test
{
  echo "## default (x through L1)"; $g gemv_throughput --ignored --nocapture 2>&1 | grep '^|'
  echo "## MLXCEL_GEMV_SMEM=1 (x staged as f32 with sums, 8 warps/block)"; MLXCEL_GEMV_SMEM=1 $g gemv_throughput --ignored --nocapture 2>&1 | grep '^|'
  echo "## MLXCEL_GEMV_SMEM=1 MLXCEL_GEMV_WARPS=4"; MLXCEL_GEMV_SMEM=1 MLXCEL_GEMV_WARPS=4 $g gemv_throughput --ignored --nocapture 2>&1 | grep '^|'
  echo "## MLXCEL_GEMV_SMEM=1 MLXCEL_GEMV_WARPS=16"; MLXCEL_GEMV_SMEM=1 MLXCEL_GEMV_WARPS=16 $g gemv_throughput --ignored --nocapture 2>&1 | grep '^|'
  for r in 1 2 4; do echo "## MLXCEL_GEMV_R=$r"; MLXCEL_GEMV_R=$r $g gemv_throughput --ignored --nocapture 2>&1 | grep '^|'; done
} > $OUT/gemv.md 2>&1
cat $OUT/gemv.md
MLXCEL=.gpu/bin/mlxcel MLXCEL_COMMIT=${COMMIT:-wip} timeout 200 bash scripts/bench_representative.sh -o $OUT/bench-auto.md --only llama-3.1-8b-4bit,qwen3-8b-4bit,qwen2.5-0.5b-bf16,qwen3-30b-a3b-4bit -- --device cuda -p 512 -g 128 -r 3 2>> $OUT/bench.err >/dev/null
cat $OUT/bench-auto.md
for keys in 64 32 8; do
  echo "MLXCEL_ATT_KEYS=$keys: $(MLXCEL_ATT_KEYS=$keys timeout 40 .gpu/bin/mlxcel bench --preset llama-3.1-8b-4bit --device cuda -p 512 -g 128 -r 3 --json 2>/dev/null | python3 -c 'import json,sys; r=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(r["decode_tps_mean"], r["decode_tps_std"])')" | tee -a $OUT/att-keys.txt
done
MLXCEL_CUDA_PROFILE=1 timeout 60 .gpu/bin/mlxcel bench --preset llama-3.1-8b-4bit --device cuda -p 16 -g 32 -r 1 > $OUT/profile.txt 2>&1
grep -A14 "graph 1\b\|decode" $OUT/profile.txt | head -40
