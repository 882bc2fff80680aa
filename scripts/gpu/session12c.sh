#!/usr/bin/env bash
# GPU, 2026-12-06 (12), third call: grouped_rows with tiles of 32 pairs as the default: checks
# (failures in full), the op cases again with tiles of 16 (MLXCEL_MOE_ROWS=2); qwen3-30b-a3b
# prefill with tiles of 32, 16 and 64 and grouped_qmm side by side; the prefill's kernels by
# Nsight Compute (what the profile's 363 us a launch for q_proj [4096 x 2048] is) and by the
# profile's events. Stage as for session12.sh.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
checks_in_full
MLXCEL_MOE_ROWS=2 MLXCEL_REQUIRE_CUDA=1 timeout 100 .gpu/tests/gpu-test op_cases > /tmp/rows2.txt 2>&1; echo "op cases, tiles of 16: rc=$?"
grep -E "test result" /tmp/rows2.txt; grep -A20 panicked /tmp/rows2.txt | head -30
echo "== moe prefill side by side [t=$((SECONDS - t0))]"
bench rows4 qwen3-30b-a3b-4bit
bench rows2 qwen3-30b-a3b-4bit MLXCEL_MOE_ROWS=2
bench rows8 qwen3-30b-a3b-4bit MLXCEL_MOE_ROWS=8
bench qmm qwen3-30b-a3b-4bit MLXCEL_MOE_ROWS=0
echo "== profile [t=$((SECONDS - t0))]"
MLXCEL_CUDA_PROFILE=1 timeout 90 .gpu/bin/mlxcel bench --preset qwen3-30b-a3b-4bit --device cuda -p 512 -g 4 -r 2 > $OUT/profile-moe.txt 2>&1
echo "== profile rc=$?"; grep -A16 "graph 0" $OUT/profile-moe.txt | head -20
echo "== prefill kernels [t=$((SECONDS - t0))]"
prefill_kernels qwen3-30b-a3b-4bit 30
cp /tmp/ncu-prefill-qwen3-30b-a3b-4bit.csv $OUT/ 2>/dev/null
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/ncu.err; tail -5 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
