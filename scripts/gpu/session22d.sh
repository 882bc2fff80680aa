#!/usr/bin/env bash
# GPU, session 22 (2026-12-07), call 2, same build as session22c.sh (the machine still warm):
# the representative sweep, then the llama and MoE steps kernel by kernel (Nsight, 512-token
# context). About 8 minutes warm.
source "$(dirname "$0")/common.sh"
t0=$SECONDS; mkdir -p $OUT; unpack_ptx
nvidia-smi --query-gpu=name --format=csv,noheader >> $OUT/report.txt
rlog "== sweep [t=$((SECONDS - t0))]"
rrun sweep
rlog "== steps kernel by kernel (512-token context) [t=$((SECONDS - t0))]"
P=512 rrun ncu_step llama llama-3.1-8b-4bit
P=512 rrun ncu_step moe qwen3-30b-a3b-4bit
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
