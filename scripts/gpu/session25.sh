#!/usr/bin/env bash
# GPU, for session 25: two opt-in forms prepared in session 24 and not yet run.
# - MLXCEL_PDL_ATTENTION=1: the decode attention launched programmatically
#   (attention_lanes_early_{D}: its first round of old keys and values requested before it
#   waits for the q, k and v launch);
# - MLXCEL_ARN_RAW=1: add_rms_norm requesting every value (the norm's weights too) as raw bits
#   in one batch, converted after (add_rms_norm_raw).
# Checks of the build, the same checks with both set, then decode with each against neither,
# alternating, two rounds (the MoE, which runs add_rms_norm every layer, and the 8B presets).
# The small presets are session25b.sh's (one call holds at most 600 s).
source "$(dirname "$0")/common.sh"
checked_report
rlog "== checks with MLXCEL_PDL_ATTENTION=1 MLXCEL_ARN_RAW=1 [t=$((SECONDS - t0))]"
(export MLXCEL_PDL_ATTENTION=1 MLXCEL_ARN_RAW=1; rrun checks_in_full)
rlog "== early attention / raw add_rms_norm / neither [t=$((SECONDS - t0))]"
for i in 1 2; do
  rrun bench early$i-moe qwen3-30b-a3b-4bit MLXCEL_PDL_ATTENTION=1
  rrun bench raw$i-moe qwen3-30b-a3b-4bit MLXCEL_ARN_RAW=1
  rrun bench plain$i-moe qwen3-30b-a3b-4bit
done
for p in llama-3.1-8b-4bit qwen3-8b-4bit; do
  for i in 1 2; do
    rrun bench early$i-$p $p MLXCEL_PDL_ATTENTION=1
    rrun bench plain$i-$p $p
  done
done
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
