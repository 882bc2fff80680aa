#!/usr/bin/env bash
# GPU, session 24 (2026-12-07), call 2: the experts' down product and the combine in one launch
# (tc_gather_combine, a token's pairs of a tile in a thread-block cluster), the routed launches
# programmatic, add_rms_norm's weights loaded with the row. .gpu/old = e0f4134 (the combine,
# neither of the last two). Checks, then qwen3-30b-a3b decode: all on / MLXCEL_CUDA_FUSE_DOWN=0 /
# MLXCEL_PDL_GATHER=0 / old, two rounds alternating; the decode attention's keys a split and
# heads a block by their variables; the MoE step under Nsight.
source "$(dirname "$0")/common.sh"
checked_report
rlog "== MoE: all / down apart / plain routed launches / old (e0f4134) [t=$((SECONDS - t0))]"
for i in 1 2; do
  rrun bench all$i qwen3-30b-a3b-4bit
  rrun bench down-apart$i qwen3-30b-a3b-4bit MLXCEL_CUDA_FUSE_DOWN=0
  rrun bench pdl-gather-off$i qwen3-30b-a3b-4bit MLXCEL_PDL_GATHER=0
  rrun old old$i qwen3-30b-a3b-4bit
done
rlog "== decode attention: keys a split (default 32), 4 heads a block [t=$((SECONDS - t0))]"
for p in qwen3-30b-a3b-4bit llama-3.1-8b-4bit; do
  rrun bench att-default-$p $p
  rrun bench att-keys16-$p $p MLXCEL_ATT_KEYS=16
  rrun bench att-group4-$p $p MLXCEL_ATT_LANES_GROUP=1
done
rlog "== MoE step under Nsight [t=$((SECONDS - t0))]"
P=512 rrun ncu_step moe qwen3-30b-a3b-4bit
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
