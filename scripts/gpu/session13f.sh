#!/usr/bin/env bash
# GPU, 2026-12-06 (13), sixth call: checks after the review commit (the planning graph keeps a
# folded residual sum's buffer until its GEMV writes it): gpu-test and parity_cuda, nothing else
# (parity_cuda took 76 s in call 5, so a longer limit than gpu_checks gives it).
source "$(dirname "$0")/common.sh"
unpack_ptx
{
MLXCEL_REQUIRE_CUDA=1 timeout 150 .gpu/tests/gpu-test --test-threads 1 --skip every_kernel > /tmp/tests.txt 2>&1; echo "gpu-test rc=$?"
grep -E "test result|FAILED" /tmp/tests.txt | head
grep -A20 "panicked" /tmp/tests.txt | head -40
MLXCEL_REQUIRE_CUDA=1 timeout 120 .gpu/tests/parity_cuda-test --nocapture > /tmp/parity.txt 2>&1; echo "parity rc=$?"
grep -E "test result|panicked|qwen2_moe" -A2 /tmp/parity.txt | head -20
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
