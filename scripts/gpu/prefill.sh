#!/usr/bin/env bash
# GPU: the routed products grouped by expert at prefill (grouped.cu) and the register rule of
# the tensor-core GEMV by block size: GPU checks, the sweep, each new path off side by side, and
# where the prefill of llama and qwen3-30b-a3b goes now ($OUT/profile-*.txt).
source "$(dirname "$0")/common.sh"
{
gpu_checks
sweep
bench moe-ungrouped qwen3-30b-a3b-4bit MLXCEL_MOE_GROUPED=0
bench qwen05-noflash qwen2.5-0.5b-bf16 MLXCEL_ATT_FLASH=0
bench gemma-bounded gemma3-1b-4bit MLXCEL_TC_GEMV_REGS=64
bench moe-bounded qwen3-30b-a3b-4bit MLXCEL_TC_GEMV_REGS=64
for p in llama-3.1-8b-4bit qwen3-30b-a3b-4bit; do
  MLXCEL_CUDA_PROFILE=1 timeout 90 .gpu/bin/mlxcel bench --preset $p --device cuda -p 512 -g 4 -r 1 > $OUT/profile-$p.txt 2>&1
  echo "== profile $p rc=$?"; head -40 $OUT/profile-$p.txt
done
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
