#!/usr/bin/env bash
# GPU, 2026-12-07 (21), third call: the routed experts' kernels with fewer warps a block and the
# double-buffered loop (tc_gather_q{glu,gemv}_*_db), set by MLXCEL_GATHER_GLU / _DOWN=N[db]. The
# default GLU runs 8 warps a block at 96 registers: two blocks an SM, so qwen3-30b-a3b's 384
# blocks take 1.45 rounds. Checks with the variants, then decode alternating. About 3 minutes.
source "$(dirname "$0")/common.sh"
checked_report
rlog "== checks, MLXCEL_GATHER_GLU=4db MLXCEL_GATHER_DOWN=2db [t=$((SECONDS - t0))]"
MLXCEL_GATHER_GLU=4db MLXCEL_GATHER_DOWN=2db rrun checks_in_full
rlog "== decode, qwen3-30b-a3b-4bit [t=$((SECONDS - t0))]"
for i in 1 2; do
  rrun bench default-moe qwen3-30b-a3b-4bit
  rrun bench glu4-moe qwen3-30b-a3b-4bit MLXCEL_GATHER_GLU=4
  rrun bench glu4db-moe qwen3-30b-a3b-4bit MLXCEL_GATHER_GLU=4db
  rrun bench glu2db-moe qwen3-30b-a3b-4bit MLXCEL_GATHER_GLU=2db
  rrun bench down2db-moe qwen3-30b-a3b-4bit MLXCEL_GATHER_DOWN=2db
  rrun bench both-moe qwen3-30b-a3b-4bit MLXCEL_GATHER_GLU=4db MLXCEL_GATHER_DOWN=2db
done
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
