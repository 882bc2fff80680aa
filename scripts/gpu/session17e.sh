#!/usr/bin/env bash
# GPU, 2026-12-06 (17), a short call (about 2.5 minutes warm) for a small budget: the default
# checks; serve at 64 streams with clients sending together and the engine gathering a burst
# (step log summarized); the 64-row step with the batched attention aimed at 4096 / 2048 / 1024
# blocks.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
echo "== checks (defaults)"
checks_in_full
echo "== serve at 64 [t=$((SECONDS - t0))]"
serve_steps CONC=64 SERVE_S=100
echo "== 64-row step, attention aiming at 4096 / 2048 / 1024 blocks [t=$((SECONDS - t0))]"
for b in 4096 2048 1024; do batch 64 MLXCEL_ATT_BATCH_BLOCKS=$b; done
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
