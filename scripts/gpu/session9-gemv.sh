#!/usr/bin/env bash
# GPU, written 2026-12-06 (9) with no device time left, for the next session's first call:
# what bounds the batch-1 GEMV, and the two switches 4627d4f added unrun.
#   1. memory_patterns-test (ignored): the weight-access patterns alone, no arithmetic (or a
#      fixed dependent chain): MLX's row-major tiles against the tile-packed layout, one or two
#      chunks in flight, across tiles or not, and packed ranges without barriers.
#   2. op cases, fused patterns (tall products loop over tiles) and parity: default, then with
#      MLXCEL_TC_PACK=1 MLXCEL_TC_AHEAD=1, then also MLXCEL_TC_WARPS=16 (more tiles a block).
#   3. decode side by side in one process per configuration: default, AHEAD, PACK, both; the
#      MoE preset with the branch-free router selection (MLXCEL_ROUTE_KEYED=1) too.
# Stage with ../shared/gpu/stage, keep gpu-test, parity_cuda-test and memory_patterns-test in
# .gpu/tests, gzip the PTX cache into .gpu/extra (README.md); carry [".gpu"].
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
(timeout 200 .gpu/bin/mlxcel bench --preset llama-3.2-1b-4bit --device cuda -p 16 -g 4 -r 1 > /dev/null 2> /tmp/warm.err; echo "warm rc=$?") &
echo "== access patterns"
timeout 120 .gpu/tests/memory_patterns-test --ignored --nocapture > $OUT/patterns.md 2>&1; echo "patterns rc=$?"
grep "^|" $OUT/patterns.md
wait
echo "== checks, default [t=$((SECONDS - t0))]"
gpu_checks
for vars in "MLXCEL_TC_PACK=1 MLXCEL_TC_AHEAD=1 MLXCEL_ROUTE_KEYED=1" "MLXCEL_TC_PACK=1 MLXCEL_TC_AHEAD=1 MLXCEL_TC_WARPS=16"; do
  echo "== checks, $vars [t=$((SECONDS - t0))]"
  env $vars MLXCEL_REQUIRE_CUDA=1 timeout 150 .gpu/tests/gpu-test --test-threads 1 --skip every_kernel > /tmp/tests.txt 2>&1; echo "gpu-test rc=$?"
  grep -E "test result|differ|panicked|FAIL|mismatch" /tmp/tests.txt | head -20
  env $vars MLXCEL_REQUIRE_CUDA=1 timeout 60 .gpu/tests/parity_cuda-test > /tmp/parity.txt 2>&1; echo "parity rc=$?"
done
echo "== decode [t=$((SECONDS - t0))]"
for p in llama-3.1-8b-4bit qwen3-8b-4bit llama-3.2-1b-4bit; do
  bench def-$p $p
  bench ahead-$p $p MLXCEL_TC_AHEAD=1
  bench pack-$p $p MLXCEL_TC_PACK=1
  bench both-$p $p MLXCEL_TC_PACK=1 MLXCEL_TC_AHEAD=1
done
bench def-moe qwen3-30b-a3b-4bit
bench keyed-moe qwen3-30b-a3b-4bit MLXCEL_ROUTE_KEYED=1
bench all-moe qwen3-30b-a3b-4bit MLXCEL_ROUTE_KEYED=1 MLXCEL_TC_PACK=1 MLXCEL_TC_AHEAD=1
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
