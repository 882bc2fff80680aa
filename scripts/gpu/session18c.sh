#!/usr/bin/env bash
# GPU, 2026-12-07 (18), second call: the dequantization change with its fix (the bias term
# takes x's own run sums; the offsets' sums are kept apart, since the odd values are staged
# divided by 16) checked, and measured side by side against 708a52a (.gpu/old); then the
# serve at 64 streams with when each request reached the HTTP side and the engine; then the
# warp-stall reasons of the batch-1 GLU. In order of need; about 4 minutes.
source "$(dirname "$0")/common.sh"
checked_report
rlog "== decode, old / new / old / new [t=$((SECONDS - t0))]"
old_new 2 llama-3.1-8b-4bit qwen3-8b-4bit
old_new 1 llama-3.2-1b-4bit qwen3-30b-a3b-4bit
rlog "== serve at 64, with when each request came and was taken [t=$((SECONDS - t0))]"
rrun serve_steps CONC=64 SERVE_S=100
grep "^admit" $OUT/serve.txt | tail -64 | head -64 >> $OUT/report.txt
rlog "== stalls [t=$((SECONDS - t0))]"
rrun ncu_stalls tc_qglu_f16_4
rlog "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err >> $OUT/report.txt
cat $OUT/report.txt
