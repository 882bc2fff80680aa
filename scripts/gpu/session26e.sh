#!/usr/bin/env bash
# GPU, session 26's fourth call: the build with the early attention on by default and the
# q, k and v products double-buffered by default where no per-head norms are clustered (after
# session26a/b/d.sh). Checks, then each preset against .gpu/old (0c0588e) and against the
# switches turned off, and the other launch switches on top (PDL for every product, persist 2).
source "$(dirname "$0")/common.sh"
checked_report
rlog "== llama-3.1-8b: default / PDL all / persist 2 / both / neither new default / old [t=$((SECONDS - t0))]"
for i in 1 2; do
  rrun bench new$i-llama llama-3.1-8b-4bit
  rrun bench pdl$i-llama llama-3.1-8b-4bit MLXCEL_PDL=1
  rrun bench persist$i-llama llama-3.1-8b-4bit MLXCEL_TC_PERSIST=2
  rrun bench pdlpersist$i-llama llama-3.1-8b-4bit MLXCEL_PDL=1 MLXCEL_TC_PERSIST=2
  rrun bench off$i-llama llama-3.1-8b-4bit MLXCEL_PDL_ATTENTION=0 MLXCEL_TC_DB_QKV=0
  rrun old old$i-llama llama-3.1-8b-4bit
done
rlog "== qwen3-8b: default / PDL all / old [t=$((SECONDS - t0))]"
for i in 1 2; do
  rrun bench new$i-qwen3 qwen3-8b-4bit
  rrun bench pdl$i-qwen3 qwen3-8b-4bit MLXCEL_PDL=1
  rrun old old$i-qwen3 qwen3-8b-4bit
done
rlog "== small presets and the MoE: default / early attention off [t=$((SECONDS - t0))]"
for i in 1 2; do
  for p in qwen2.5-0.5b-bf16 llama-3.2-1b-4bit qwen3-30b-a3b-4bit; do
    rrun bench new$i-$p $p
    rrun bench off$i-$p $p MLXCEL_PDL_ATTENTION=0
  done
done
rlog "== issue 7's Gemma check: gemma3-1b against its Llama twin [t=$((SECONDS - t0))]"
for i in 1 2; do
  rrun bench gemma$i gemma3-1b-4bit
  rrun bench apart$i gemma3-1b-4bit MLXCEL_CUDA_FUSE_QK_NORM=0
  rrun bench twin$i llama-as-gemma3-1b-4bit
done
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
