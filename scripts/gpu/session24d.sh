#!/usr/bin/env bash
# GPU, session 24 (2026-12-07), call 4: the MoE router's product (gemv.cu qgemv, 8-bit) launched
# programmatically after add_rms_norm, which lets it start at once: its weights are requested
# while the norm runs. Checks, then qwen3-30b-a3b decode against MLXCEL_PDL_SMALL=0, alternating,
# three rounds; the attention's keys a split at 48 and 64 (default 32).
source "$(dirname "$0")/common.sh"
checked_report
rlog "== MoE: router product programmatic / plain [t=$((SECONDS - t0))]"
for i in 1 2 3; do
  rrun bench pdl-small$i qwen3-30b-a3b-4bit
  rrun bench pdl-small-off$i qwen3-30b-a3b-4bit MLXCEL_PDL_SMALL=0
done
rlog "== decode attention: keys a split 48, 64 [t=$((SECONDS - t0))]"
rrun bench att-keys48 qwen3-30b-a3b-4bit MLXCEL_ATT_KEYS=48
rrun bench att-keys64 qwen3-30b-a3b-4bit MLXCEL_ATT_KEYS=64
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
