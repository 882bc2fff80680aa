#!/usr/bin/env bash
# GPU, session 25's first call: three opt-in forms not yet run.
# - MLXCEL_PDL_ATTENTION=1: the decode attention launched programmatically
#   (attention_lanes_early_{D}: its first round of old keys and values requested before it
#   waits for the q, k and v launch);
# - MLXCEL_ARN_RAW=1: add_rms_norm requesting every value (the norm's weights too) as raw bits
#   in one batch, converted after (add_rms_norm_raw);
# - MLXCEL_TC_DB_QKV=1: the q, k and v products (with their rope, and the per-head norms'
#   clusters) double-buffered, both chunks of a warp requested before the add + RMSNorm.
# Also in this build: tc_qdot's double buffer requests its first two chunks before x is staged
# (the default double-buffered GLU, qwen3-8b's), measured against .gpu/old (main before).
# Checks of the build, the same checks with the three set, the fused patterns with few warps
# (so the q, k and v cases take the double buffer), then decode alternating, two rounds.
source "$(dirname "$0")/common.sh"
checked_report
rlog "== checks with MLXCEL_PDL_ATTENTION=1 MLXCEL_ARN_RAW=1 MLXCEL_TC_DB_QKV=1 [t=$((SECONDS - t0))]"
(export MLXCEL_PDL_ATTENTION=1 MLXCEL_ARN_RAW=1 MLXCEL_TC_DB_QKV=1; rrun checks_in_full)
rlog "== fused patterns, MLXCEL_TC_DB_QKV=1 MLXCEL_TC_WARPS=2 [t=$((SECONDS - t0))]"
MLXCEL_TC_DB_QKV=1 MLXCEL_TC_WARPS=2 MLXCEL_REQUIRE_CUDA=1 timeout 100 .gpu/tests/gpu-test fused_decode_patterns \
  > /tmp/fused.txt 2>&1; rlog "rc=$?"; rrun grep -E "test result|panicked" -A8 /tmp/fused.txt
rlog "== 8B: double-buffered q/k/v / early attention / plain / old [t=$((SECONDS - t0))]"
for p in llama-3.1-8b-4bit qwen3-8b-4bit; do
  for i in 1 2; do
    rrun bench dbqkv$i-$p $p MLXCEL_TC_DB_QKV=1
    rrun bench early$i-$p $p MLXCEL_PDL_ATTENTION=1
    rrun bench plain$i-$p $p
    rrun old old$i-$p $p
  done
done
rlog "== MoE: early attention / raw add_rms_norm / neither [t=$((SECONDS - t0))]"
for i in 1 2; do
  rrun bench early$i-moe qwen3-30b-a3b-4bit MLXCEL_PDL_ATTENTION=1
  rrun bench raw$i-moe qwen3-30b-a3b-4bit MLXCEL_ARN_RAW=1
  rrun bench plain$i-moe qwen3-30b-a3b-4bit
done
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
