#!/usr/bin/env bash
# GPU, 2026-12-06 (15), second call: the new attention defaults (per-head attention_lanes at one
# row for every 16-bit cache, grouped ones included; attention_lanes_g4 in batched steps, whose
# splits aim at about 4096 blocks) checked and measured; the old choice side by side
# (MLXCEL_ATT_GQA=all MLXCEL_ATT_LANES_GROUP=0); qmm_rows with a 16-row weight tile a warp
# (MLXCEL_QMM_MT=1, 164 registers against 254: three blocks an SM) checked and measured in
# batched steps and serve.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
echo "== default checks"
checks_in_full
echo "== checks with MLXCEL_QMM_MT=1 [t=$((SECONDS - t0))]"
MLXCEL_QMM_MT=1 checks_in_full
echo "== decode, new defaults [t=$((SECONDS - t0))]"
for p in llama-3.1-8b-4bit qwen3-8b-4bit qwen2.5-0.5b-bf16 llama-3.2-1b-4bit qwen3-30b-a3b-4bit gemma3-1b-4bit llama-as-gemma3-1b-4bit; do
  bench "$p" $p
done
bench "gemma3-1b-4bit-2" gemma3-1b-4bit
bench "llama-as-gemma3-1b-4bit-2" llama-as-gemma3-1b-4bit
bench "llama-3.1-8b-4bit-old" llama-3.1-8b-4bit MLXCEL_ATT_GQA=all MLXCEL_ATT_LANES_GROUP=0
echo "== batched steps: new / per-head (LANES_GROUP=0) / old (GQA=all LANES_GROUP=0) / QMM_MT=1 [t=$((SECONDS - t0))]"
for n in 8 32 64; do
  batch $n
  batch $n MLXCEL_ATT_LANES_GROUP=0
  batch $n MLXCEL_ATT_GQA=all MLXCEL_ATT_LANES_GROUP=0
  batch $n MLXCEL_QMM_MT=1
done
echo "== serve at 64 streams, warmed up: new defaults, then QMM_MT=1 [t=$((SECONDS - t0))]"
CONC=64 SERVE_S=100 bash scripts/gpu/serve-bench.sh
MLXCEL_QMM_MT=1 CONC=64 SERVE_S=100 bash scripts/gpu/serve-bench.sh
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
