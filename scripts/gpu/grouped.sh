#!/usr/bin/env bash
# GPU: the grouped routed product with the next chunk requested before the tensor cores run
# (bounded at 128 registers, or not: MLXCEL_MOE_GROUPED_REGS=0), the combine a thread an output
# at prefill; GPU checks, qwen3-30b-a3b side by side, and its prefill profile.
source "$(dirname "$0")/common.sh"
{
gpu_checks
sweep
bench moe-bounded qwen3-30b-a3b-4bit
bench moe-unbounded qwen3-30b-a3b-4bit MLXCEL_MOE_GROUPED_REGS=0
bench moe-gather qwen3-30b-a3b-4bit MLXCEL_MOE_GROUPED=0
MLXCEL_CUDA_PROFILE=1 timeout 90 .gpu/bin/mlxcel bench --preset qwen3-30b-a3b-4bit --device cuda -p 512 -g 4 -r 3 > $OUT/profile-moe.txt 2>&1
echo "== profile rc=$?"; grep -A14 "graph 0" $OUT/profile-moe.txt
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
