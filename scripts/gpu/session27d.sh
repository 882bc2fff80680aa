#!/usr/bin/env bash
# GPU, session 27's closing call on main (Gemma 3's 256-wide q/k norms folded by default):
# checks, the representative sweep, issue 7's Gemma check (gemma3-1b against its Llama twin in
# f16, the default, and in bf16, Gemma's dtype), the SmolLM2-shaped preset, and the decode
# attention's block aim (MLXCEL_ATT_FILL, default 264) on the two small presets; then the
# replayed steps of llama-3.1-8b, gemma3-1b and its twin as they ran (Nsight Systems, kernels
# overlapping), where the machine has nsys. Not run in session 27 (no device started): the next
# session's first call.
source "$(dirname "$0")/common.sh"
checked_report
rlog "== sweep [t=$((SECONDS - t0))]"
COMMIT=$(cat .gpu/commit 2>/dev/null || echo main) rrun sweep
cp /tmp/sweep.md $OUT/sweep.md
rlog "== issue 7's Gemma check [t=$((SECONDS - t0))]"
for i in 1 2 3; do
  rrun bench gemma$i gemma3-1b-4bit
  rrun bench twin$i llama-as-gemma3-1b-4bit
  rrun bench twinbf16-$i llama-as-gemma3-1b-4bit MLXCEL_DTYPE=bf16
done
rlog "== small presets: the attention's block aim 264 (default) / 132 / 528 [t=$((SECONDS - t0))]"
for i in 1 2; do
  for p in smollm2-135m-4bit gemma3-1b-4bit; do
    rrun bench fill264-$i-$p $p
    rrun bench fill132-$i-$p $p MLXCEL_ATT_FILL=132
    rrun bench fill528-$i-$p $p MLXCEL_ATT_FILL=528
  done
done
rlog "== the steps as they ran [t=$((SECONDS - t0))]"
rrun nsys_step llama llama-3.1-8b-4bit
rrun nsys_step gemma gemma3-1b-4bit
rrun nsys_step twin llama-as-gemma3-1b-4bit
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
