#!/usr/bin/env bash
# GPU, for session 25: the decode attention launched programmatically (MLXCEL_PDL_ATTENTION=1:
# attention_lanes_early_{D}, which requests its first round of old keys and values before it
# waits for the q, k and v launch), prepared in session 24 and not yet run. Checks of the build,
# then the same checks with the early attention, then decode with it against without,
# alternating, two rounds on the MoE, the 8B presets and the small ones.
source "$(dirname "$0")/common.sh"
checked_report
rlog "== checks with MLXCEL_PDL_ATTENTION=1 [t=$((SECONDS - t0))]"
(export MLXCEL_PDL_ATTENTION=1; rrun checks_in_full)
rlog "== early attention / plain [t=$((SECONDS - t0))]"
for p in qwen3-30b-a3b-4bit llama-3.1-8b-4bit qwen3-8b-4bit; do
  for i in 1 2; do
    rrun bench early$i-$p $p MLXCEL_PDL_ATTENTION=1
    rrun bench plain$i-$p $p
  done
done
for p in qwen2.5-0.5b-bf16 gemma3-1b-4bit llama-3.2-1b-4bit; do
  rrun bench early-$p $p MLXCEL_PDL_ATTENTION=1
  rrun bench plain-$p $p
done
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
