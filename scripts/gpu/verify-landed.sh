#!/usr/bin/env bash
# GPU, first call of a session: correctness (op cases, fused patterns, parity) of what landed
# since the last GPU run, the representative sweep, serve's throughput table, and each recent
# change off side by side. Landed unrun at the end of the 2026-12-03 (4) session: KvWrite with a
# slot a token (the paged pool written with one kv_write a pool and layer: serve's batch-64 step
# 12869 -> 645 launches; op cases kv_write/*/slot_per_token), the grouped MoE kernel unbounded
# by default (measured as the _r0 variant), and the small-batch tensor-core product for batched
# decode (MLXCEL_SMALL_BATCH_TC=1, off by default: its op cases with it on, then serve's table
# with it on against off). One file back: $OUT/report.txt (and serve's files).
# Stage as scripts/gpu/README.md says (the PTX precompiled into .gpu/extra too).
source "$(dirname "$0")/common.sh"
{
gpu_checks
grep -E "slot_per_token" /tmp/tests.txt | head -5
MLXCEL_SMALL_BATCH_TC=1 MLXCEL_REQUIRE_CUDA=1 timeout 150 .gpu/tests/gpu-test op_cases --test-threads 1 > /tmp/tests-sb.txt 2>&1
echo "op cases with the small-batch path rc=$?"; grep -E "test result|differ|panicked|FAIL|mismatch" /tmp/tests-sb.txt | head
# The batched step alone (bench --batch: serve's paged step, timed), small-batch path off and on.
for sb in 0 1; do for n in 1 8 64; do
  MLXCEL_SMALL_BATCH_TC=$sb timeout 90 .gpu/bin/mlxcel bench --preset llama-3.1-8b-4bit --device cuda --batch $n -p 256 -g 64 -r 2 --json > /tmp/batch.json 2>> /tmp/bench.err
  echo "batch $n small-batch=$sb $(grep -o '"aggregate_tps_mean"[^,]*' /tmp/batch.json) $(grep -o '"ms_per_step_mean"[^,}]*' /tmp/batch.json)"
done; done
echo "== serve"; SERVE_S=150 timeout 230 bash scripts/gpu/serve-bench.sh
echo "== serve, small-batch path"; MLXCEL_SMALL_BATCH_TC=1 SERVE_S=150 timeout 230 bash scripts/gpu/serve-bench.sh
sweep
bench moe-ungrouped qwen3-30b-a3b-4bit MLXCEL_MOE_GROUPED=0
bench llama-noflash llama-3.1-8b-4bit MLXCEL_ATT_FLASH=0
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
