#!/usr/bin/env bash
# GPU, first call of a session: correctness (op cases, fused patterns, parity) of what landed
# since the last GPU run, the representative sweep, serve's throughput table, and each recent
# change off side by side. Landed unrun at the end of the 2026-12-03 (4) session: KvWrite with a
# slot a token (the paged pool written with one kv_write a pool and layer: serve's batch-64 step
# 12869 -> 645 launches; op cases kv_write/*/slot_per_token), the grouped MoE kernel unbounded
# by default (measured as the _r0 variant). One file back: $OUT/report.txt (and serve's files).
# Stage as scripts/gpu/README.md says (the PTX precompiled into .gpu/extra too).
source "$(dirname "$0")/common.sh"
{
gpu_checks
grep -E "slot_per_token" /tmp/tests.txt | head -5
echo "== serve"; SERVE_S=150 timeout 230 bash scripts/gpu/serve-bench.sh
sweep
bench moe-ungrouped qwen3-30b-a3b-4bit MLXCEL_MOE_GROUPED=0
bench llama-noflash llama-3.1-8b-4bit MLXCEL_ATT_FLASH=0
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
