#!/usr/bin/env bash
# GPU, 2026-12-04 (8), second call: loads issued together (ldf without branches, scales with the
# GEMV's weights, attention's keys and values in flight together) against the build before it
# (.gpu/old: the same presets side by side in this call), correctness first, then each decode
# step's kernels timed by Nsight Compute. $OUT/report.txt + step tables.
source "$(dirname "$0")/common.sh"
for f in .gpu/extra/ptx-*.ptx.gz; do [ -f "$f" ] && gunzip -c "$f" > "$MLXCEL_CACHE_DIR/$(basename "${f%.gz}")"; done
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -f .gpu/old/ptx.gz ] && gunzip -c .gpu/old/ptx.gz > "$MLXCEL_CACHE_DIR/$(cat .gpu/old/ptx.name)"
ncu_step() {
  local name=$1 preset=$2; shift 2
  env "$@" timeout 150 $ncu --csv --metrics gpu__time_duration.sum --cache-control none --clock-control none \
    --launch-skip ${SKIP:-3000} --launch-count ${COUNT:-2500} --log-file /tmp/ncu-$name.csv \
    .gpu/bin/mlxcel bench --preset $preset --device cuda -p 64 -g 40 -r 1 > /dev/null 2>> /tmp/ncu.err
  echo "== ncu step $name rc=$?"
  python3 scripts/gpu/step_kernels.py /tmp/ncu-$name.csv --full $OUT/step-$name.tsv > $OUT/step-$name.md 2>&1
  head -22 $OUT/step-$name.md
}
# old NAME PRESET [VAR=VALUE ...]: bench with the build before the change.
old() {
  local name=$1 preset=$2; shift 2
  env "$@" timeout 60 .gpu/old/mlxcel bench --preset $preset --device cuda -p 512 -g 128 -r 2 --json > /tmp/$name.json 2>> /tmp/bench.err
  echo "$name $(grep -o '"decode_tps_mean"[^,]*' /tmp/$name.json) $(grep -o '"decode_tps_std"[^,]*' /tmp/$name.json) $(grep -o '"prefill_tps_mean"[^,]*' /tmp/$name.json)"
}
{
t0=$SECONDS
gpu_checks
grep -E "^test .*(FAILED|failed)|panicked" /tmp/tests.txt /tmp/parity.txt | head
echo "== bench, before (old) and after [t=$((SECONDS - t0))]"
for p in llama-3.1-8b-4bit qwen3-30b-a3b-4bit qwen3-8b-4bit llama-3.2-1b-4bit gemma3-1b-4bit qwen2.5-0.5b-bf16; do
  old old-$p $p; bench new-$p $p
done
echo "== switches [t=$((SECONDS - t0))]"
bench llama-pdl llama-3.1-8b-4bit MLXCEL_PDL=1
bench llama-online llama-3.1-8b-4bit MLXCEL_ATT_ONLINE=1
bench moe-pdl qwen3-30b-a3b-4bit MLXCEL_PDL=1
batch 64
echo "== step kernels [t=$((SECONDS - t0))]"
ncu_step llama llama-3.1-8b-4bit
ncu_step moe qwen3-30b-a3b-4bit
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
