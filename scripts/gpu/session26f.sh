#!/usr/bin/env bash
# GPU, session 26's fifth call, on session26e.sh's build: every product programmatic
# (MLXCEL_PDL=1) with no more blocks than tiles need (MLXCEL_TC_PERSIST=2), which gained 9% on
# llama-3.1-8b and (PDL alone) 6.5% on qwen3-8b in session26e.sh, on the other presets; the
# checks with both set. Gemma with its norms apart (MLXCEL_CUDA_FUSE_QK_NORM=0: the build's
# 256-wide fold lost).
source "$(dirname "$0")/common.sh"
started_report
rlog "== checks with MLXCEL_PDL=1 MLXCEL_TC_PERSIST=2 [t=$((SECONDS - t0))]"
(export MLXCEL_PDL=1 MLXCEL_TC_PERSIST=2; rrun checks_in_full)
pp="MLXCEL_PDL=1 MLXCEL_TC_PERSIST=2"
for i in 1 2; do
  rrun bench pp$i-qwen3 qwen3-8b-4bit $pp
  rrun bench new$i-qwen3 qwen3-8b-4bit
  for p in qwen3-30b-a3b-4bit qwen2.5-0.5b-bf16 llama-3.2-1b-4bit; do
    rrun bench pp$i-$p $p $pp
    rrun bench new$i-$p $p
  done
  rrun bench pp$i-gemma gemma3-1b-4bit $pp MLXCEL_CUDA_FUSE_QK_NORM=0
  rrun bench apart$i-gemma gemma3-1b-4bit MLXCEL_CUDA_FUSE_QK_NORM=0
done
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
