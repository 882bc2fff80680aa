#!/usr/bin/env bash
# GPU, 2026-12-07 (20), second call: the stream-K tensor-core GEMV and GLU (MLXCEL_TC_SK=1, and
# =2 with two chunks in flight a warp) checked, then measured against the default and the
# double-buffered GLU on five presets; the llama step kernel by kernel with stream-K at a
# 512-token context. About 6 minutes warm.
source "$(dirname "$0")/common.sh"
checked_report
for v in 1 2; do
  rlog "== checks, MLXCEL_TC_SK=$v [t=$((SECONDS - t0))]"
  MLXCEL_TC_SK=$v rrun checks_in_full
done
rlog "== decode: default, stream-K (1), stream-K with two chunks in flight (2), double-buffered GLU [t=$((SECONDS - t0))]"
for p in llama-3.1-8b-4bit qwen3-8b-4bit; do
  for i in 1 2; do
    rrun bench off-$p $p
    rrun bench sk1-$p $p MLXCEL_TC_SK=1
    rrun bench sk2-$p $p MLXCEL_TC_SK=2
    rrun bench dbglu-$p $p MLXCEL_TC_DB_GLU=1
  done
done
for p in qwen3-30b-a3b-4bit llama-3.2-1b-4bit gemma3-1b-4bit; do
  rrun bench off-$p $p; rrun bench sk1-$p $p MLXCEL_TC_SK=1; rrun bench sk2-$p $p MLXCEL_TC_SK=2
done
rlog "== llama step kernel by kernel, MLXCEL_TC_SK=2, 512-token context [t=$((SECONDS - t0))]"
P=512 rrun ncu_step llama8b-sk2 llama-3.1-8b-4bit MLXCEL_TC_SK=2
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
