#!/usr/bin/env bash
# GPU, first call of a session: correctness (op cases, fused patterns, parity) of what landed
# since the last GPU run, then serve's batched decode step alone (bench --batch) under each
# recent change, profiles of the 64- and 8-row steps, and serve's table. Landed unrun in the
# 2026-12-03 (5) session: qmm_rows, the tensor-core product of 2 to 64 rows
# (MLXCEL_SMALL_BATCH_TC=0 keeps the 8-row CUDA-core GEMV and cuBLAS), and the grouped MoE
# kernel without its dense mode. serve-and-sweep.sh is the second call. One file back:
# $OUT/report.txt, and $OUT/profile-*.txt.
# Stage as scripts/gpu/README.md says (the PTX precompiled into .gpu/extra too).
source "$(dirname "$0")/common.sh"
{
gpu_checks
grep -E "qmm_rows|batch/|paged_attention" /tmp/tests.txt | head -5
for n in 1 8 64; do
  batch $n
  batch $n MLXCEL_SMALL_BATCH_TC=0
done
tail -3 /tmp/bench.err
for n in 64 8; do
  MLXCEL_CUDA_PROFILE=1 timeout 90 .gpu/bin/mlxcel bench --preset llama-3.1-8b-4bit --device cuda --batch $n -p 256 -g 16 -r 1 > $OUT/profile-b$n.txt 2>&1
  echo "== profile, $n rows rc=$?"; grep -v "^\s*$" $OUT/profile-b$n.txt | head -24
done
echo "== serve"; SERVE_S=170 timeout 250 bash scripts/gpu/serve-bench.sh
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
