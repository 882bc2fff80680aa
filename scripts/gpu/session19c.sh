#!/usr/bin/env bash
# GPU, 2026-12-07 (19): the batch-1 loop compiled for the usual case (branch tc-fast-loop)
# checked, then side by side with the build before it (.gpu/old, 8db2cf0); serve at 1, 8, 32
# and 64 streams with the tokenizer's fix and the arrival log; the 64-row step's attention
# block aim; the balanced persistent grid; the sweep. In order of need, about 9 minutes warm.
source "$(dirname "$0")/common.sh"
checked_report
rlog "== decode, old / new [t=$((SECONDS - t0))]"
old_new 2 llama-3.1-8b-4bit qwen3-8b-4bit
old_new 1 llama-3.2-1b-4bit qwen3-30b-a3b-4bit gemma3-1b-4bit
rlog "== serve [t=$((SECONDS - t0))]"
rrun serve_steps SERVE_S=150
rrun python3 scripts/gpu/admits.py $OUT/serve.txt
rlog "== 64 rows by the batched attention's block aim [t=$((SECONDS - t0))]"
for i in 1 2; do rrun batch 64; rrun batch 64 MLXCEL_ATT_BATCH_BLOCKS=2048; done
rlog "== persistent grids: as many as fit (1, default), balanced (2), a block a tile (0) [t=$((SECONDS - t0))]"
for i in 1 2; do for m in 1 2 0; do rrun bench persist$m-llama llama-3.1-8b-4bit MLXCEL_TC_PERSIST=$m; done; done
rlog "== sweep [t=$((SECONDS - t0))]"
COMMIT=tc-fast-loop rrun sweep
cp /tmp/sweep.md $OUT/ 2>/dev/null
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
