#!/usr/bin/env bash
# GPU, 2026-12-07 (20), after session20.sh: where the llama and MoE steps go, kernel by kernel
# at a 512-token context, and the batch-1 GLU's warp stalls with and without the
# double-buffered loop. About 5 minutes warm.
source "$(dirname "$0")/common.sh"
unpack_ptx
t0=$SECONDS
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $OUT/report.txt
rlog "== steps kernel by kernel at a 512-token context [t=$((SECONDS - t0))]"
P=512 rrun ncu_step llama8b llama-3.1-8b-4bit
P=512 rrun ncu_step moe qwen3-30b-a3b-4bit
rlog "== GLU stalls, default and double-buffered [t=$((SECONDS - t0))]"
MLXCEL_TC_DB_GLU=0 rrun ncu_stalls tc_qglu_f16_4
MLXCEL_TC_DB_GLU=1 rrun ncu_stalls tc_qglu_f16_4_db
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
