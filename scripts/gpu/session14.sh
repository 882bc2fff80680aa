#!/usr/bin/env bash
# GPU, written 2026-12-06 (14) without device time, first of two calls (about 7 minutes warm):
# the per-head decode attention with several keys in flight a warp (nn.cu
# attention_lanes_{32,64,128,256}, MLXCEL_ATT_LANES=1, off by default). The checks with it on:
# every op case (the decode attention cases at 32, 64, 128 and 256 channels, paged and with the
# folded rope among them) and parity_cuda. Then decode side by side, lanes off and on, on the
# presets whose attention is the per-head kernel (qwen2.5-0.5b and llama-3.2-1b: 64-wide heads;
# qwen3-30b-a3b: groups of 8), also with 64 keys a split; and serve's 64-row step with the
# online grouped attention (MLXCEL_ATT_ONLINE=1, never measured at 64 rows) against the default;
# and gemma3-1b beside llama-as-gemma3-1b-4bit, a Llama of its shape (issue 7's Gemma check).
# session14b.sh has the default checks, serve and the profiles.
# Stage: ../shared/gpu/stage, prune .gpu/tests to gpu-test and parity_cuda-test, the gzipped
# PTX cache in .gpu/extra.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
echo "== checks with MLXCEL_ATT_LANES=1"
MLXCEL_ATT_LANES=1 MLXCEL_REQUIRE_CUDA=1 timeout 170 .gpu/tests/gpu-test --test-threads 1 --skip every_kernel > /tmp/tests.txt 2>&1; echo "gpu-test rc=$?"
grep -E "test result|FAILED" /tmp/tests.txt | head
grep -A20 "panicked" /tmp/tests.txt | head -60
MLXCEL_ATT_LANES=1 MLXCEL_REQUIRE_CUDA=1 timeout 120 .gpu/tests/parity_cuda-test > /tmp/parity.txt 2>&1; echo "parity rc=$?"
grep -E "test result|panicked" -A3 /tmp/parity.txt | head
echo "== side by side [t=$((SECONDS - t0))]"
for r in 1 2; do
  bench "q05-split-$r" qwen2.5-0.5b-bf16
  bench "q05-lanes-$r" qwen2.5-0.5b-bf16 MLXCEL_ATT_LANES=1
done
bench "q05-lanes-keys64" qwen2.5-0.5b-bf16 MLXCEL_ATT_LANES=1 MLXCEL_ATT_KEYS=64
# The rope and cache writes folded into the attention (one launch a layer fewer) lost with
# attention_split on the H100; attention_lanes_rope_64 is its lanes form.
bench "q05-lanes-rope" qwen2.5-0.5b-bf16 MLXCEL_ATT_LANES=1 MLXCEL_CUDA_FUSE_ROPE_ATTENTION=1
bench "l1b-split" llama-3.2-1b-4bit
bench "l1b-lanes" llama-3.2-1b-4bit MLXCEL_ATT_LANES=1
bench "moe-split" qwen3-30b-a3b-4bit
bench "moe-lanes" qwen3-30b-a3b-4bit MLXCEL_ATT_LANES=1
bench "moe-lanes-keys64" qwen3-30b-a3b-4bit MLXCEL_ATT_LANES=1 MLXCEL_ATT_KEYS=64
echo "== issue 7's Gemma check: gemma3-1b against a Llama of its shape (same bytes a token) [t=$((SECONDS - t0))]"
for r in 1 2; do
  bench "gemma3-1b-$r" gemma3-1b-4bit
  bench "llama-as-gemma3-1b-$r" llama-as-gemma3-1b-4bit
done
echo "== serve's 64-row step: the grouped paged attention as it is and online [t=$((SECONDS - t0))]"
batch 64
batch 64 MLXCEL_ATT_ONLINE=1
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
