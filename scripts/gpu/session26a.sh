#!/usr/bin/env bash
# GPU, prepared in sessions 24 and 25 (neither had a device call run), for session 26's first
# call: the opt-in forms' checks, then the dense 8B presets. The opt-ins:
# - MLXCEL_PDL_ATTENTION=1: the decode attention launched programmatically
#   (attention_lanes_early_{D}: its first round of old keys and values requested before it
#   waits for the q, k and v launch);
# - MLXCEL_ARN_RAW=1: add_rms_norm requesting every value (the norm's weights too) as raw bits
#   in one batch, converted after (add_rms_norm_raw);
# - MLXCEL_TC_DB_QKV=1: the q, k and v products (with their rope, and the per-head norms'
#   clusters) double-buffered, both chunks of a warp requested before the add + RMSNorm;
# - MLXCEL_TC_DB4=1: 4-warp batch-1 GLUs double-buffered at 128 registers (_db4, four blocks an
#   SM) where that costs no round of tiles (llama-3.1-8b's: two rounds either way); =2: the
#   same requesting each next tile's first chunks during the tile before (_db4a);
# - MLXCEL_PDL_COMBINE=1: the MoE combine (weighted_sum_pdl) lets the next layer's q, k and v
#   products start at once.
# Also in this build, by default: tc_qdot's double buffer requests its first two chunks before
# x is staged (the _db GLU that qwen3-8b takes), measured in session26b.sh against .gpu/old:
# the build of 0c0588e (main before it; restage.sh there, then its stripped bin/mlxcel and its
# ptx-*.cubin.gz into .gpu/old of this build's staging).
# Checks of the build; the same with every opt-in set; the fused patterns with few warps, so
# the q, k and v cases take their double buffer (2 warps) and the GLU cases _db4 (4 warps,
# the unbounded _db barred, at most 2 blocks so that blocks take several tiles; and the default
# kernels so, MLXCEL_TC_BLOCKS=2); then llama-3.1-8b's decode, alternating, two rounds.
# session26b.sh: qwen3-8b (the default _db GLU against .gpu/old), the MoE and small presets;
# session26c.sh (run as part of session26d.sh): dense switches and the GLU's source-level stalls.
source "$(dirname "$0")/common.sh"
checked_report
all="MLXCEL_PDL_ATTENTION=1 MLXCEL_ARN_RAW=1 MLXCEL_TC_DB_QKV=1 MLXCEL_TC_DB4=2 MLXCEL_PDL_COMBINE=1"
rlog "== checks with $all [t=$((SECONDS - t0))]"
(export $all; rrun checks_in_full)
fused() {
  env "$@" MLXCEL_REQUIRE_CUDA=1 timeout 100 .gpu/tests/gpu-test fused_decode_patterns > /tmp/fused.txt 2>&1
  echo "fused patterns $* rc=$?"
  grep -E "test result|panicked" -A8 /tmp/fused.txt
}
rlog "== fused patterns with few warps [t=$((SECONDS - t0))]"
rrun fused MLXCEL_TC_DB_QKV=1 MLXCEL_TC_WARPS=2
rrun fused MLXCEL_TC_DB4=1 MLXCEL_TC_DB_GLU=0 MLXCEL_TC_WARPS=4 MLXCEL_TC_BLOCKS=2
rrun fused MLXCEL_TC_DB4=2 MLXCEL_TC_DB_GLU=0 MLXCEL_TC_WARPS=4 MLXCEL_TC_BLOCKS=2
rrun fused MLXCEL_TC_BLOCKS=2
rlog "== llama-3.1-8b: q/k/v double-buffered / GLU _db4, _db4a / both / early attention / plain / old [t=$((SECONDS - t0))]"
for i in 1 2; do
  rrun bench dbqkv$i-llama llama-3.1-8b-4bit MLXCEL_TC_DB_QKV=1
  rrun bench db4-$i-llama llama-3.1-8b-4bit MLXCEL_TC_DB4=1
  rrun bench db4a$i-llama llama-3.1-8b-4bit MLXCEL_TC_DB4=2
  rrun bench both$i-llama llama-3.1-8b-4bit MLXCEL_TC_DB_QKV=1 MLXCEL_TC_DB4=2
  rrun bench early$i-llama llama-3.1-8b-4bit MLXCEL_PDL_ATTENTION=1
  rrun bench plain$i-llama llama-3.1-8b-4bit
  rrun old old$i-llama llama-3.1-8b-4bit
done
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
