#!/usr/bin/env bash
# GPU: the ring GEMV at 4 stages with programmatic launch (both off by default), for deciding
# its defaults. Correctness with both on (op cases, fused patterns, parity; greedy tokens the
# same with and without programmatic launch), then which products should take the ring: all
# (MLXCEL_RING_MIN=0) or those of at least 24 / 48 Mi weights, on two 8B and two 1B presets,
# against the defaults (one-chunk kernel, plain launches); the online decode attention
# (MLXCEL_ATT_ONLINE=1, in the correctness run too) at batch 1 and 64 rows. One file back:
# $OUT/report.txt.
# (This session's last call timed out with every bench empty, for a reason not found: run it
# with the PTX staged, and look at /tmp/bench.err's tail first.)
source "$(dirname "$0")/common.sh"
on="MLXCEL_TC_RING=4 MLXCEL_PDL=1"
{
env $on MLXCEL_ATT_ONLINE=1 bash -c "source scripts/gpu/common.sh; gpu_checks"
.gpu/bin/mlxcel synth --preset llama-3.2-1b-4bit --out /tmp/l1b --force > /dev/null 2>&1
toks=$(seq -s, 1 200)
for v in "$on" "MLXCEL_TC_RING=4" "MLXCEL_X=1"; do
  env $v timeout 60 .gpu/bin/mlxcel generate -m /tmp/l1b --device cuda --prompt-tokens $toks -n 96 --json > "/tmp/gen-${v// /_}.json" 2>>/tmp/gen.err
  echo "generate $v rc=$? $(grep -o '"tokens":\[[0-9,]*' "/tmp/gen-${v// /_}.json" | head -c 80)"
done
tail -2 /tmp/gen.err
bench llama-default llama-3.1-8b-4bit
bench llama-all llama-3.1-8b-4bit $on MLXCEL_RING_MIN=0
for m in 24 48; do bench llama-min$m llama-3.1-8b-4bit $on MLXCEL_RING_MIN=$m; done
bench qwen3-default qwen3-8b-4bit
for m in 24 48; do bench qwen3-min$m qwen3-8b-4bit $on MLXCEL_RING_MIN=$m; done
for p in llama-3.2-1b-4bit gemma3-1b-4bit; do
  bench $p-default $p
  for m in 24 48; do bench $p-min$m $p $on MLXCEL_RING_MIN=$m; done
done
# The online decode attention (MLXCEL_ATT_ONLINE=1, off by default; checked above with the rest).
bench llama-att-online llama-3.1-8b-4bit MLXCEL_ATT_ONLINE=1
bench gemma-att-online gemma3-1b-4bit MLXCEL_ATT_ONLINE=1
batch 64; batch 64 MLXCEL_ATT_ONLINE=1
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
