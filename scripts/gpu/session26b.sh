#!/usr/bin/env bash
# GPU, session 26's second call (after session26a.sh's checks passed): qwen3-8b's double-buffered
# q, k and v and early attention, and main's GLU change against .gpu/old; the MoE under the early
# attention (MLXCEL_PDL_ATTENTION=1), the raw add_rms_norm (MLXCEL_ARN_RAW=1) and the early
# combine (MLXCEL_PDL_COMBINE=1) against none, alternating, two rounds; the early attention on
# the small presets; issue 7's Gemma check (gemma3-1b against llama-as-gemma3-1b, the same
# bytes a token).
source "$(dirname "$0")/common.sh"
started_report
rlog "== qwen3-8b: q/k/v double-buffered / early attention / plain / old [t=$((SECONDS - t0))]"
for i in 1 2; do
  rrun bench dbqkv$i-qwen3 qwen3-8b-4bit MLXCEL_TC_DB_QKV=1
  rrun bench early$i-qwen3 qwen3-8b-4bit MLXCEL_PDL_ATTENTION=1
  rrun bench plain$i-qwen3 qwen3-8b-4bit
  rrun old old$i-qwen3 qwen3-8b-4bit
done
rlog "== MoE: early attention / raw add_rms_norm / early combine / none [t=$((SECONDS - t0))]"
for i in 1 2; do
  rrun bench early$i-moe qwen3-30b-a3b-4bit MLXCEL_PDL_ATTENTION=1
  rrun bench raw$i-moe qwen3-30b-a3b-4bit MLXCEL_ARN_RAW=1
  rrun bench combine$i-moe qwen3-30b-a3b-4bit MLXCEL_PDL_COMBINE=1
  rrun bench plain$i-moe qwen3-30b-a3b-4bit
done
rlog "== small presets: early attention / plain [t=$((SECONDS - t0))]"
for p in qwen2.5-0.5b-bf16 gemma3-1b-4bit llama-3.2-1b-4bit; do
  rrun bench early-$p $p MLXCEL_PDL_ATTENTION=1
  rrun bench plain-$p $p
done
gemma_check 2
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
