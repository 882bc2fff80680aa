#!/usr/bin/env bash
# GPU, 2026-12-07 (20): the batch-1 products' scale loads halved (one per row a chunk, or one
# 32-bit pair at groups of 32), checked and measured against 7ea4b1c (.gpu/old); the
# double-buffered chunk loop (MLXCEL_TC_DB*, opt-in) checked and measured. About 8 minutes warm.
source "$(dirname "$0")/common.sh"
checked_report
rlog "== checks, double-buffered (MLXCEL_TC_DB=2: unbounded) [t=$((SECONDS - t0))]"
MLXCEL_TC_DB=2 rrun gpu_checks
rlog "== gpu-test, double-buffered products bounded (MLXCEL_TC_DB=1) [t=$((SECONDS - t0))]"
MLXCEL_TC_DB=1 MLXCEL_REQUIRE_CUDA=1 timeout 150 .gpu/tests/gpu-test --test-threads 1 --skip every_kernel > /tmp/tests1.txt 2>&1
rlog "gpu-test TC_DB=1 rc=$?"; rrun grep -E "test result|panicked" /tmp/tests1.txt
rlog "== decode, old (7ea4b1c) / new (scale loads) [t=$((SECONDS - t0))]"
old_new 2 llama-3.1-8b-4bit qwen3-8b-4bit
old_new 1 qwen3-30b-a3b-4bit llama-3.2-1b-4bit
rlog "== double-buffered loop: default, both bounded (1), both unbounded (2), GLU alone, products alone [t=$((SECONDS - t0))]"
for p in llama-3.1-8b-4bit qwen3-8b-4bit; do
  for i in 1 2; do
    rrun bench db-off-$p $p
    rrun bench db1-$p $p MLXCEL_TC_DB=1
    rrun bench db2-$p $p MLXCEL_TC_DB=2
    rrun bench dbglu-$p $p MLXCEL_TC_DB_GLU=1
    rrun bench dbgemv80-$p $p MLXCEL_TC_DB_GEMV=80
  done
done
for p in qwen3-30b-a3b-4bit llama-3.2-1b-4bit gemma3-1b-4bit; do
  rrun bench db-off-$p $p; rrun bench db1-$p $p MLXCEL_TC_DB=1; rrun bench db2-$p $p MLXCEL_TC_DB=2
done
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
