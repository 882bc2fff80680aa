#!/usr/bin/env bash
# GPU, 2026-12-06 (17), written for a third call that could not start: the defaults checked
# (qmm_ring and qmm_ring3 on, the GLU launch opt-in), the fused patterns with MLXCEL_QMM_GLU=1
# (its launch now opts in to its 48 KiB of dynamic and its static shared memory); serve's table
# with the benchmark's clients sending together and the engine gathering a burst's requests
# into its first step, with the step log; the 64-row step with the batched attention aimed at
# 4096 (default), 2048 and 1024 blocks; Nsight's warp-stall reasons of the batch-1 tensor-core
# GLU and GEMV; decode of the two 8B presets. About 6 minutes warm.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
echo "== checks (defaults)"
checks_in_full
echo "== fused patterns with MLXCEL_QMM_GLU=1 [t=$((SECONDS - t0))]"
MLXCEL_QMM_GLU=1 MLXCEL_REQUIRE_CUDA=1 timeout 100 .gpu/tests/gpu-test fused_decode_patterns > /tmp/glu.txt 2>&1; echo "rc=$?"
grep -E "test result|panicked" -A3 /tmp/glu.txt | head -8
echo "== serve [t=$((SECONDS - t0))]"
serve_steps SERVE_S=200
echo "== 64-row step, attention aiming at 4096 / 2048 / 1024 blocks [t=$((SECONDS - t0))]"
for b in 4096 2048 1024; do batch 64 MLXCEL_ATT_BATCH_BLOCKS=$b; done
echo "== batch-1 stalls [t=$((SECONDS - t0))]"
ncu_stalls tc_qglu_f16_4 tc_qgemv_f16_4
echo "== decode [t=$((SECONDS - t0))]"
bench llama8b llama-3.1-8b-4bit
bench qwen3-8b qwen3-8b-4bit
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
