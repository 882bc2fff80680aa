#!/usr/bin/env bash
# GPU, written 2026-12-06 (14) without device time, second of two calls (about 7 minutes warm):
# the default checks (the session's changes on default paths: an op case of 256-wide heads in
# groups of 8 for attention_split, gqa_keys flagging a bad length in any row, the prompt's step
# also returning the logits' log-sum-exp); serve at 64 streams with the level warmed up first
# (bench_serve.py --warmup, new); then Nsight's per-kernel steps of qwen2.5-0.5b with
# attention_lanes on, and of gemma3-1b and llama-3.1-8b as they are (none since session 11).
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
echo "== default checks"
checks_in_full
echo "== serve at 64 streams, warmed up [t=$((SECONDS - t0))]"
CONC=64 SERVE_S=120 bash scripts/gpu/serve-bench.sh
echo "== steps [t=$((SECONDS - t0))]"
SKIP=1500 COUNT=1500 ncu_step q05-lanes qwen2.5-0.5b-bf16 MLXCEL_ATT_LANES=1
SKIP=1500 COUNT=1500 ncu_step gemma3-1b gemma3-1b-4bit
ncu_step llama8b llama-3.1-8b-4bit
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
