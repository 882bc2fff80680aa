#!/usr/bin/env bash
# GPU, session 23 (2026-12-07), call 2; main at 801352f + the cluster kernel: checks (the products with Qwen3's and
# Gemma's per-head norms among the fusion cases), then decode with the norms in the products'
# launch against MLXCEL_CUDA_FUSE_PRODUCTS_ROPE=0 (qwen3-8b, qwen3-30b-a3b), alternating;
# gemma3-1b with its 256-wide heads' norms folded (MLXCEL_CUDA_FUSE_QK_NORM=all, now into the
# products) against the default; then the MoE and qwen3-8b steps under Nsight. The norms'
# launch two ways: a head's tiles in a thread-block cluster (tc_qgemv3_nrope, the default) and
# with tickets (MLXCEL_CUDA_QK_NORM_CLUSTER=0, tc_qgemv3_rope), the fusion cases checked both ways.
source "$(dirname "$0")/common.sh"
checked_report
rlog "== fused cases with tickets [t=$((SECONDS - t0))]"
MLXCEL_CUDA_QK_NORM_CLUSTER=0 MLXCEL_REQUIRE_CUDA=1 timeout 100 .gpu/tests/gpu-test fused_decode_patterns > /tmp/tickets.txt 2>&1
rlog "tickets rc=$?"
grep -E "test result|panicked" -A12 /tmp/tickets.txt | head -30 >> $OUT/report.txt
rlog "== products with q/k norms and rope: clusters / tickets / apart [t=$((SECONDS - t0))]"
for i in 1 2; do
  for p in qwen3-8b-4bit qwen3-30b-a3b-4bit; do
    rrun bench "cluster-$p" $p
    rrun bench "tickets-$p" $p MLXCEL_CUDA_QK_NORM_CLUSTER=0
    rrun bench "apart-$p" $p MLXCEL_CUDA_FUSE_PRODUCTS_ROPE=0
  done
  rrun bench default-gemma3 gemma3-1b-4bit
  rrun bench qknorm-all-gemma3 gemma3-1b-4bit MLXCEL_CUDA_FUSE_QK_NORM=all
done
rlog "== MoE step under Nsight [t=$((SECONDS - t0))]"
P=512 rrun ncu_step moe qwen3-30b-a3b-4bit
P=512 rrun ncu_step qwen3-8b qwen3-8b-4bit
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
