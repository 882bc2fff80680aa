#!/usr/bin/env bash
# GPU: the grouped routed product with the next chunk requested before the tensor cores run
# (bounded at 128 registers, or not: MLXCEL_MOE_GROUPED_REGS=0), the combine a thread an output
# at prefill; GPU checks, qwen3-30b-a3b side by side and its prefill profile; then serve's
# throughput at 1/8/32/64 streams (scripts/gpu/serve-bench.sh), the sweep, and Nsight Compute on
# the decode GEMV of the q/o shape (what holds it at 0.7 TB/s). Most important first.
source "$(dirname "$0")/common.sh"
{
gpu_checks
bench moe-bounded qwen3-30b-a3b-4bit
bench moe-unbounded qwen3-30b-a3b-4bit MLXCEL_MOE_GROUPED_REGS=0
MLXCEL_CUDA_PROFILE=1 timeout 90 .gpu/bin/mlxcel bench --preset qwen3-30b-a3b-4bit --device cuda -p 512 -g 4 -r 3 > $OUT/profile-moe.txt 2>&1
echo "== profile rc=$?"; grep -A14 "graph 0" $OUT/profile-moe.txt
echo "== serve"; SERVE_S=150 timeout 230 bash scripts/gpu/serve-bench.sh
sweep
ncu_gemv tc_qgemv_f16_4
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
