#!/usr/bin/env bash
# GPU, 2026-12-06 (13), sixth call: checks after the review commit (the planning graph keeps a
# folded residual sum's buffer until its GEMV writes it): gpu-test and parity_cuda, nothing else.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
gpu_checks
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
