#!/usr/bin/env bash
# GPU, prepared in session 26 (whose device time ran out before it could run): main with the
# four launch defaults session 26 measured one by one (early attention, the rope-path q/k/v
# double buffer, every tensor-core product programmatic, the even split of tiles) checked, then
# llama-3.1-8b and qwen3-8b by default against the old launch rules, alternating, and the
# representative sweep of six presets (the issue's figures, on whichever card the call gets).
source "$(dirname "$0")/common.sh"
checked_report
for i in 1 2; do
  rrun bench new$i-llama llama-3.1-8b-4bit
  rrun bench rules$i-llama llama-3.1-8b-4bit MLXCEL_PDL=small MLXCEL_TC_PERSIST=1
  rrun bench new$i-qwen3 qwen3-8b-4bit
  rrun bench rules$i-qwen3 qwen3-8b-4bit MLXCEL_PDL=small MLXCEL_TC_PERSIST=1
done
rlog "== sweep [t=$((SECONDS - t0))]"
rrun sweep
cp /tmp/sweep.md $OUT/sweep.md
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
