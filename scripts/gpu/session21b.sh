#!/usr/bin/env bash
# GPU, 2026-12-07 (21), second call: every kernel starting with pdl_enter (common.cuh) and, with
# MLXCEL_PDL_ALL=1, launched with programmatic dependent launch. Checks in both modes, then
# decode against the build before the session (.gpu/old, bc92079), alternating: the MoE preset
# with the session's MoE fusions off and on, the other presets, serve's batched step at 8 and
# 32 rows. About 6 minutes warm.
source "$(dirname "$0")/common.sh"
checked_report
rlog "== checks, MLXCEL_PDL_ALL=1 [t=$((SECONDS - t0))]"
MLXCEL_PDL_ALL=1 rrun checks_in_full
off="MLXCEL_CUDA_FUSE_ROUTER_PRODUCT=0 MLXCEL_CUDA_FUSE_COMBINE=0"
rlog "== decode: old, new (MoE fusions off), new PDL_ALL=1 (off), new PDL_ALL=1 (on) [t=$((SECONDS - t0))]"
for i in 1 2; do
  rrun old old-moe qwen3-30b-a3b-4bit
  rrun bench pdl0-moe qwen3-30b-a3b-4bit $off
  rrun bench pdl1-moe qwen3-30b-a3b-4bit MLXCEL_PDL_ALL=1 $off
  rrun bench pdl1f-moe qwen3-30b-a3b-4bit MLXCEL_PDL_ALL=1
done
rlog "== decode: old, new, new PDL_ALL=1 [t=$((SECONDS - t0))]"
for p in llama-3.1-8b-4bit llama-3.2-1b-4bit qwen2.5-0.5b-bf16 gemma3-1b-4bit qwen3-8b-4bit; do
  for i in 1 2; do
    rrun old old-$p $p
    rrun bench pdl0-$p $p
    rrun bench pdl1-$p $p MLXCEL_PDL_ALL=1
  done
done
rlog "== batched step, 8B preset [t=$((SECONDS - t0))]"
for n in 8 32; do rrun batch $n; rrun batch $n MLXCEL_PDL_ALL=1; done
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
