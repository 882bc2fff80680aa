#!/usr/bin/env bash
# GPU, 2026-12-04 (8), first call: what landed unrun (checks with the defaults; serve's table with
# batched prefill), the switches left off (programmatic launch, the ring, online attention) on
# the 8B and MoE presets, and each step's kernels timed one by one inside the replayed graph
# (Nsight Compute, duration only, no cache flush: step_kernels.py), so the step's time splits
# into kernel time and what the gaps between kernels cost. $OUT/report.txt + step tables.
source "$(dirname "$0")/common.sh"
{
t0=$SECONDS
gpu_checks
echo "== serve, batched prefill [t=$((SECONDS - t0))]"; SERVE_S=150 timeout 200 bash scripts/gpu/serve-bench.sh
echo "== bench [t=$((SECONDS - t0))]"
bench llama-default llama-3.1-8b-4bit
bench llama-pdl llama-3.1-8b-4bit MLXCEL_PDL=1
bench llama-ring4pdl llama-3.1-8b-4bit MLXCEL_TC_RING=4 MLXCEL_PDL=1
bench llama-online llama-3.1-8b-4bit MLXCEL_ATT_ONLINE=1
bench moe-default qwen3-30b-a3b-4bit
bench moe-pdl qwen3-30b-a3b-4bit MLXCEL_PDL=1
echo "== step kernels [t=$((SECONDS - t0))]"
ncu_step llama llama-3.1-8b-4bit
ncu_step moe qwen3-30b-a3b-4bit
tail -3 /tmp/ncu.err
echo "[t=$((SECONDS - t0))]"
tail -5 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
