#!/usr/bin/env bash
# GPU, 2026-12-07 (19), second call: the checks; serve at 1, 8, 32 and 64 streams now that the
# tokenizer counts its vocabulary once (call 1's arrival log: a burst reached the engine two
# requests every 45 ms), with the step log; the batched attention's block aim at 64 rows,
# alternating; llama-3.1-8b by tensor-core warps a block; the balanced persistent grid (MLXCEL_TC_PERSIST=2)
# against the default and a block a tile; the representative sweep. In order
# of need, about 7 minutes warm.
source "$(dirname "$0")/common.sh"
checked_report
rlog "== serve [t=$((SECONDS - t0))]"
rrun serve_steps SERVE_S=200
rrun python3 scripts/gpu/admits.py $OUT/serve.txt
rlog "== 64 rows by the batched attention's block aim [t=$((SECONDS - t0))]"
for i in 1 2; do rrun batch 64; rrun batch 64 MLXCEL_ATT_BATCH_BLOCKS=2048; done
rlog "== llama-3.1-8b by tensor-core warps a block [t=$((SECONDS - t0))]"
rrun bench default llama-3.1-8b-4bit
for w in 2 8 16; do rrun bench warps$w llama-3.1-8b-4bit MLXCEL_TC_WARPS=$w; done
rlog "== persistent grids: a block a tile (0), as many as fit (1, default), balanced (2) [t=$((SECONDS - t0))]"
for i in 1 2; do for m in 1 2 0; do rrun bench persist$m-llama llama-3.1-8b-4bit MLXCEL_TC_PERSIST=$m; done; done
for m in 1 2 0; do rrun bench persist$m-qwen3 qwen3-8b-4bit MLXCEL_TC_PERSIST=$m; done
rlog "== sweep [t=$((SECONDS - t0))]"
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo wip) rrun sweep
cp /tmp/sweep.md $OUT/ 2>/dev/null
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
