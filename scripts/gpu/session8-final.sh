#!/usr/bin/env bash
# GPU, 2026-12-04 (8), fourth call: the final build (attention_split's loads typed by the cache
# dtype, after the third call found its branchy loads 8.0 -> 14.5 us) checked (op cases, parity),
# then against the build before the session's kernel changes (.gpu/old) side by side, and a
# prefill profile of each (the third call measured llama prefill 12.5k -> 11.0k tok/s).
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
(timeout 240 .gpu/old/mlxcel bench --preset llama-3.2-1b-4bit --device cuda -p 16 -g 4 -r 1 > /dev/null 2> /tmp/warm-old.err; echo "old warm rc=$?") &
gpu_checks
grep -E "^test .*(FAILED|failed)|panicked" /tmp/tests.txt /tmp/parity.txt | head
wait
echo "== side by side [t=$((SECONDS - t0))]"
for p in llama-3.1-8b-4bit qwen3-30b-a3b-4bit qwen3-8b-4bit llama-3.2-1b-4bit gemma3-1b-4bit qwen2.5-0.5b-bf16; do
  old old-$p $p; bench new-$p $p
done
echo "== 64-row step [t=$((SECONDS - t0))]"
timeout 90 .gpu/old/mlxcel bench --preset llama-3.1-8b-4bit --device cuda --batch 64 -p 256 -g 64 -r 2 --json > /tmp/ob.json 2>> /tmp/bench.err
echo "old batch 64 $(grep -o '"aggregate_tps_mean"[^,]*' /tmp/ob.json)"
batch 64
echo "== prefill profiles [t=$((SECONDS - t0))]"
MLXCEL_CUDA_PROFILE=1 timeout 60 .gpu/old/mlxcel bench --preset llama-3.1-8b-4bit --device cuda -p 512 -g 2 -r 1 > /dev/null 2> $OUT/prefill-old.txt
MLXCEL_CUDA_PROFILE=1 timeout 60 .gpu/bin/mlxcel bench --preset llama-3.1-8b-4bit --device cuda -p 512 -g 2 -r 1 > /dev/null 2> $OUT/prefill-new.txt
head -30 $OUT/prefill-new.txt
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
