#!/usr/bin/env bash
# GPU: Nsight Compute on the tensor-core decode GEMVs (what bounds them), a profile of the 8B step
# at the bench's context length, then decode speed and AsType per step under native/auto/bf16.
source "$(dirname "$0")/common.sh"
MLXCEL_CUDA_PROFILE=1 timeout 60 .gpu/bin/mlxcel bench --preset llama-3.1-8b-4bit --device cuda -p 512 -g 32 -r 1 > $OUT/llama-profile-512.txt 2>&1
grep -A16 "graph 1:" $OUT/llama-profile-512.txt | head -17
ncu_gemv tc_qglu_f16_4 tc_qgemv_f16_4 tc_qgemv3_f16_4
TESTS=0 timeout 330 bash scripts/gpu/dtype-policies.sh
