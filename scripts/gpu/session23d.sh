#!/usr/bin/env bash
# GPU, session 23 (2026-12-07), call 4 (short: little device time left): Gemma 3's 256-wide
# heads with their q and k norms in the products' launch, a head's 16 tiles in one
# non-portable cluster (MLXCEL_CUDA_FUSE_QK_NORM=all): its fusion cases and parity under that
# variable, then gemma3-1b decode against the default (norms apart), alternating.
source "$(dirname "$0")/common.sh"
unpack_ptx
t0=$SECONDS
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/report.txt
MLXCEL_CUDA_FUSE_QK_NORM=all MLXCEL_REQUIRE_CUDA=1 timeout 60 .gpu/tests/gpu-test fused_decode_patterns > /tmp/wide.txt 2>&1
rlog "wide fused cases rc=$?"
grep -E "test result|panicked" -A12 /tmp/wide.txt | head -30 >> $OUT/report.txt
MLXCEL_CUDA_FUSE_QK_NORM=all MLXCEL_REQUIRE_CUDA=1 timeout 60 .gpu/tests/parity_cuda-test > /tmp/parity.txt 2>&1
rlog "parity (all) rc=$?"
grep -E "test result|panicked" -A3 /tmp/parity.txt | head >> $OUT/report.txt
for i in 1 2; do
  rrun bench default-gemma3 gemma3-1b-4bit
  rrun bench cluster16-gemma3 gemma3-1b-4bit MLXCEL_CUDA_FUSE_QK_NORM=all
done
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
