#!/usr/bin/env bash
# GPU, written 2026-12-06 (15) for the next session's first call (session 15 ran out of device
# time before it): at session 15's final build (attention_lanes per head at one row, 4 heads a
# block in batched steps), the default checks with the op cases added last (batched decode
# attention in groups of 4 and 8 at 128, 64 and 32 channels, dense and paged: never run on a
# GPU), decode of the issues' presets, then serve's table at 1, 8, 32 and 64 streams (about
# 4 minutes warm). Stage with scripts/gpu/restage.sh.
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
SERVE_S=150 bash scripts/gpu/serve-bench.sh
echo "[t=$((SECONDS - t0))]"
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
