#!/usr/bin/env bash
# GPU, session 27's second build: Gemma 3's 256-wide q and k norms in the q, k and v products'
# launch with a head's 16 tiles in one thread-block cluster (non-portable size), taken with
# MLXCEL_CUDA_FUSE_QK_NORM=all. Checks with it (gpu-test has a 256-wide case now), then
# gemma3-1b default / folded / its Llama twin, alternating; the SmolLM2-shaped preset; the
# folded Gemma step under Nsight; on llama-3.1-8b two old switches again (the GLU's double
# buffer forced, the tile-packed weights).
source "$(dirname "$0")/common.sh"
checked_report
rlog "== checks with MLXCEL_CUDA_FUSE_QK_NORM=all [t=$((SECONDS - t0))]"
export MLXCEL_CUDA_FUSE_QK_NORM=all
rrun checks_in_full
unset MLXCEL_CUDA_FUSE_QK_NORM
rlog "== gemma3-1b: default / folded in clusters of 16 / twin [t=$((SECONDS - t0))]"
for i in 1 2 3; do
  rrun bench gemma$i gemma3-1b-4bit
  rrun bench fold$i gemma3-1b-4bit MLXCEL_CUDA_FUSE_QK_NORM=all
  rrun bench twin$i llama-as-gemma3-1b-4bit
done
rlog "== smollm2-135m-4bit (the SmolLM2 GGUF's shape) [t=$((SECONDS - t0))]"
rrun bench smol1 smollm2-135m-4bit
rrun bench smol2 smollm2-135m-4bit
rlog "== llama-3.1-8b: default / GLU double buffer forced / tile-packed weights [t=$((SECONDS - t0))]"
for i in 1 2; do
  rrun bench def$i-llama llama-3.1-8b-4bit
  rrun bench dbglu$i-llama llama-3.1-8b-4bit MLXCEL_TC_DB_GLU=1
  rrun bench pack$i-llama llama-3.1-8b-4bit MLXCEL_TC_PACK=1
done
rrun ncu_step gemma-fold gemma3-1b-4bit MLXCEL_CUDA_FUSE_QK_NORM=all
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
