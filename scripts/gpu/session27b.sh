#!/usr/bin/env bash
# GPU, session 27's first call: main's defaults (session 26's four launch rules, never run as
# one build) checked, and the L2 prefetch of the tensor-core GEMVs' tiles (MLXCEL_TC_L2=1: each
# tile's weights requested into L2 as a block reaches it; =2: the block's next tile's too)
# checked and measured against the default (none), alternating; then llama-3.1-8b and qwen3-8b
# by default against the old launch rules, and issue 7's Gemma check.
source "$(dirname "$0")/common.sh"
checked_report
for m in 1 2; do
  rlog "== checks with MLXCEL_TC_L2=$m [t=$((SECONDS - t0))]"
  export MLXCEL_TC_L2=$m
  rrun checks_in_full
  unset MLXCEL_TC_L2
done
rlog "== L2 prefetch: none / 1 / 2 [t=$((SECONDS - t0))]"
for i in 1 2; do
  for p in llama-3.1-8b-4bit qwen3-8b-4bit llama-3.2-1b-4bit qwen3-30b-a3b-4bit; do
    rrun bench none$i-$p $p
    rrun bench l2a$i-$p $p MLXCEL_TC_L2=1
    rrun bench l2b$i-$p $p MLXCEL_TC_L2=2
  done
done
rlog "== main's launch rules against the old ones [t=$((SECONDS - t0))]"
for i in 1 2; do
  rrun bench new$i-llama llama-3.1-8b-4bit
  rrun bench rules$i-llama llama-3.1-8b-4bit MLXCEL_PDL=small MLXCEL_TC_PERSIST=1
  rrun bench new$i-qwen3 qwen3-8b-4bit
  rrun bench rules$i-qwen3 qwen3-8b-4bit MLXCEL_PDL=small MLXCEL_TC_PERSIST=1
done
gemma_check 2
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
