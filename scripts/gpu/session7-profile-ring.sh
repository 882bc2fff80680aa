#!/usr/bin/env bash
# GPU, 2026-12-04 (7), second call: where the 64-row serve step's 10 ms go (MLXCEL_CUDA_PROFILE,
# per kernel family) and a 2048-token prefill's, then ring-min.sh's decisions without its
# checks (those passed in the first call): greedy tokens with ring/programmatic launch, the ring
# threshold on four presets, the online decode attention. One file back: $OUT/report.txt (+ profiles).
source "$(dirname "$0")/common.sh"
on="MLXCEL_TC_RING=4 MLXCEL_PDL=1"
{
t0=$SECONDS
MLXCEL_CUDA_PROFILE=1 timeout 90 .gpu/bin/mlxcel bench --preset llama-3.1-8b-4bit --device cuda --batch 64 -p 256 -g 16 -r 1 > /dev/null 2> $OUT/prof-b64.txt; echo "prof b64 rc=$?"
MLXCEL_CUDA_PROFILE=1 timeout 90 .gpu/bin/mlxcel bench --preset llama-3.1-8b-4bit --device cuda -p 2048 -g 2 -r 1 > /dev/null 2> $OUT/prof-p2048.txt; echo "prof p2048 rc=$? [t=$((SECONDS - t0))]"
.gpu/bin/mlxcel synth --preset llama-3.2-1b-4bit --out /tmp/l1b --force > /dev/null 2>&1
toks=$(seq -s, 1 200)
for v in "$on" "MLXCEL_TC_RING=4" "MLXCEL_X=1"; do
  env $v timeout 60 .gpu/bin/mlxcel generate -m /tmp/l1b --device cuda --prompt-tokens $toks -n 96 --json > "/tmp/gen-${v// /_}.json" 2>>/tmp/gen.err
  echo "generate $v rc=$? $(grep -o '"tokens":\[[0-9,]*' "/tmp/gen-${v// /_}.json" | md5sum | head -c 12)"
done
tail -2 /tmp/gen.err
bench llama-default llama-3.1-8b-4bit
bench llama-all llama-3.1-8b-4bit $on MLXCEL_RING_MIN=0
for m in 24 48; do bench llama-min$m llama-3.1-8b-4bit $on MLXCEL_RING_MIN=$m; done
echo "[t=$((SECONDS - t0))]"
bench qwen3-default qwen3-8b-4bit
bench qwen3-min24 qwen3-8b-4bit $on MLXCEL_RING_MIN=24
for p in llama-3.2-1b-4bit gemma3-1b-4bit; do
  bench $p-default $p
  for m in 24 48; do bench $p-min$m $p $on MLXCEL_RING_MIN=$m; done
done
echo "[t=$((SECONDS - t0))]"
bench llama-att-online llama-3.1-8b-4bit MLXCEL_ATT_ONLINE=1
bench gemma-att-online gemma3-1b-4bit MLXCEL_ATT_ONLINE=1
batch 64; batch 64 MLXCEL_ATT_ONLINE=1
echo "[t=$((SECONDS - t0))]"
tail -5 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
