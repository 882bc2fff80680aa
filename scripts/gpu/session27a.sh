#!/usr/bin/env bash
# GPU, prepared in session 26 (whose device time ran out before it could run): main with the
# four launch defaults session 26 measured one by one (early attention, the rope-path q/k/v
# double buffer, every tensor-core product programmatic, the even split of tiles) checked, then
# llama-3.1-8b and qwen3-8b by default against the old launch rules, alternating, and the
# representative sweep of six presets (the issue's figures, on whichever card the call gets);
# issue 7's Gemma check (gemma3-1b against its Llama twin) and the Gemma step under Nsight
# (where its 52 per-head norm launches and 26 rope-and-write launches go: session 26's fold of
# them into one launch a layer lost, unexplained).
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
rlog "== issue 7's Gemma check [t=$((SECONDS - t0))]"
for i in 1 2; do
  rrun bench gemma$i gemma3-1b-4bit
  rrun bench twin$i llama-as-gemma3-1b-4bit
done
rrun ncu_step gemma gemma3-1b-4bit
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
