#!/usr/bin/env bash
# GPU: the tensor-core GEMV's register bound. The half-chunk change took tc_qgemv from 62 to 66
# registers (ptxas), and llama-3.1-8b-4bit fell 271 -> 246 tok/s; at most 64 (the default now)
# against unbounded (MLXCEL_TC_GEMV_REGS=0), and the GLU unbounded against caps of 96/80/64
# (which spill). Decode of the dense presets under each, then each GEMV shape alone. Also the
# tensor-core prefill attention (attention.cu): its op cases, then prefill with it and without
# (MLXCEL_ATT_FLASH=0).
source "$(dirname "$0")/common.sh"
{
gpu_checks
for p in llama-3.1-8b-4bit qwen2.5-0.5b-bf16 qwen3-30b-a3b-4bit; do bench $p-noflash $p MLXCEL_ATT_FLASH=0; done
for p in llama-3.1-8b-4bit qwen3-8b-4bit; do
  bench $p-cap64 $p
  bench $p-r0 $p MLXCEL_TC_GEMV_REGS=0
  for g in 96 80 64; do bench $p-glu$g $p MLXCEL_TC_GLU_REGS=$g; done
done
bench qwen3-30b-cap64 qwen3-30b-a3b-4bit
bench qwen3-30b-r0 qwen3-30b-a3b-4bit MLXCEL_TC_GEMV_REGS=0
bench gemma-cap64 gemma3-1b-4bit
bench gemma-r0 gemma3-1b-4bit MLXCEL_TC_GEMV_REGS=0
for v in "" MLXCEL_TC_GEMV_REGS=0 MLXCEL_TC_GLU_REGS=96 MLXCEL_TC_GLU_REGS=80; do
  echo "== gemv_throughput $v"
  env $v timeout 120 .gpu/tests/gpu-test gemv_throughput --ignored --nocapture 2>&1 | grep "^|"
done
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
