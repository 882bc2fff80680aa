#!/usr/bin/env bash
# GPU, 2026-12-06 (10): the flat dequant_words, the transposes absorbed by rope_qkv_write and
# flash_prefill (prefill), the keyed router as the default: checks (failures printed in full),
# decode and prefill of five presets, serve's 64-row step, and where the llama and MoE prefills
# go kernel by kernel. Stage as for session9-gemv.sh; carry [".gpu"].
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
MLXCEL_REQUIRE_CUDA=1 timeout 150 .gpu/tests/gpu-test --test-threads 1 --skip every_kernel > /tmp/tests.txt 2>&1; echo "gpu-test rc=$?"
grep -E "test result|FAILED" /tmp/tests.txt | head
grep -A30 "panicked" /tmp/tests.txt | head -60
MLXCEL_REQUIRE_CUDA=1 timeout 60 .gpu/tests/parity_cuda-test > /tmp/parity.txt 2>&1; echo "parity rc=$?"
grep -E "test result|panicked" /tmp/parity.txt | head
echo "== bench [t=$((SECONDS - t0))]"
for p in llama-3.1-8b-4bit qwen3-8b-4bit qwen3-30b-a3b-4bit qwen2.5-0.5b-bf16 llama-3.2-1b-4bit; do bench def-$p $p; done
echo "== serve's 64-row step [t=$((SECONDS - t0))]"
batch 64
echo "== prefill kernels [t=$((SECONDS - t0))]"
PRESETS="llama-3.1-8b-4bit qwen3-30b-a3b-4bit" bash scripts/gpu/prefill-kernels.sh
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
