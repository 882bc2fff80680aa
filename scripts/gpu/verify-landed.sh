#!/usr/bin/env bash
# GPU, first call of a session: correctness (op cases, fused patterns, parity) of what landed
# since the last GPU run, then serve's batched decode step alone (bench --batch) under each
# recent change, and a profile of the 64-row step. Landed unrun, 2026-12-03 sessions (4) and
# (5): KvWrite with a slot a token (the pool written with one kv_write a pool and layer), the
# small-batch tensor-core product (MLXCEL_SMALL_BATCH_TC=1, off by default), and decode
# attention over the paged pool in place (paged_attention; MLXCEL_PAGED_ATTENTION=0 gathers the
# pool as before). serve-and-sweep.sh is the second call. One file back: $OUT/report.txt, and
# $OUT/profile-*.txt.
# Stage as scripts/gpu/README.md says (the PTX precompiled into .gpu/extra too).
source "$(dirname "$0")/common.sh"
# batch N VAR=VALUE...: serve's step of N rows (256 positions in, 64 steps, 2 runs).
batch() {
  local n=$1; shift
  env "$@" timeout 90 .gpu/bin/mlxcel bench --preset llama-3.1-8b-4bit --device cuda --batch $n -p 256 -g 64 -r 2 --json > /tmp/batch.json 2>> /tmp/bench.err
  echo "batch $n $* $(grep -o '"aggregate_tps_mean"[^,]*' /tmp/batch.json) $(grep -o '"ms_per_step_mean"[^,}]*' /tmp/batch.json)"
}
{
gpu_checks
grep -E "slot_per_token|paged_attention" /tmp/tests.txt | head -5
MLXCEL_SMALL_BATCH_TC=1 MLXCEL_REQUIRE_CUDA=1 timeout 150 .gpu/tests/gpu-test op_cases --test-threads 1 > /tmp/tests-sb.txt 2>&1
echo "op cases with the small-batch path rc=$?"; grep -E "test result|differ|panicked|FAIL|mismatch" /tmp/tests-sb.txt | head
for n in 1 8 64; do
  batch $n MLXCEL_SMALL_BATCH_TC=0
  batch $n MLXCEL_SMALL_BATCH_TC=1
done
for n in 8 64; do
  batch $n MLXCEL_SMALL_BATCH_TC=0 MLXCEL_PAGED_ATTENTION=0
  batch $n MLXCEL_SMALL_BATCH_TC=1 MLXCEL_PAGED_ATTENTION=0
done
tail -3 /tmp/bench.err
for cfg in "64 0" "64 1" "8 1"; do set -- $cfg
  MLXCEL_CUDA_PROFILE=1 MLXCEL_SMALL_BATCH_TC=$2 timeout 90 .gpu/bin/mlxcel bench --preset llama-3.1-8b-4bit --device cuda --batch $1 -p 256 -g 16 -r 1 > $OUT/profile-b$1-sb$2.txt 2>&1
  echo "== profile, $1 rows, small-batch=$2 rc=$?"; grep -v "^\s*$" $OUT/profile-b$1-sb$2.txt | head -70
done
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
