#!/usr/bin/env bash
# GPU, 2026-12-06 (15), closing call at the session's final kernels (attention_lanes per head at
# one row, 4 heads a block in batched steps; the qmm_rows variant of call 2 removed): the
# default checks, decode of the issues' presets, and serve's table at 1, 8, 32 and 64 streams.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
echo "== default checks"
checks_in_full
echo "== decode [t=$((SECONDS - t0))]"
for p in llama-3.1-8b-4bit qwen3-8b-4bit qwen2.5-0.5b-bf16 qwen3-30b-a3b-4bit gemma3-1b-4bit llama-as-gemma3-1b-4bit; do
  bench "$p" $p
done
echo "== serve [t=$((SECONDS - t0))]"
SERVE_S=200 bash scripts/gpu/serve-bench.sh
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
