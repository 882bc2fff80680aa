#!/usr/bin/env bash
# GPU, 2026-12-06 (17), the last call, by priority for a short budget: the default checks; the
# fused patterns with MLXCEL_QMM_GLU=1; serve's table with clients sending together and the
# engine gathering a burst (step log summarized); the 64-row step with the batched attention
# aimed at 4096 / 2048 / 1024 blocks; Nsight's warp-stall reasons of the batch-1 tensor-core
# GLU; decode of llama-3.1-8b. About 4.5 minutes warm.
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
MLXCEL_STEP_LOG=1 SERVE_S=150 bash scripts/gpu/serve-bench.sh
python3 scripts/gpu/step_log.py $OUT/serve.txt | grep -E "prefill|decode (1|8|32|64) rows"
echo "== 64-row step, attention aiming at 4096 / 2048 / 1024 blocks [t=$((SECONDS - t0))]"
for b in 4096 2048 1024; do batch 64 MLXCEL_ATT_BATCH_BLOCKS=$b; done
echo "== batch-1 GLU stalls [t=$((SECONDS - t0))]"
k=tc_qglu_f16_4
timeout 60 $(ncu_bin) -k regex:"^$k\$" --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
  --metrics regex:'smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
  .gpu/tests/gpu-test gemv_throughput --ignored --nocapture > $OUT/ncu-stalls-$k.txt 2>&1
echo "ncu rc=$?"
grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issued Warp|Eligible Warps" $OUT/ncu-stalls-$k.txt | head -8
grep -E "issue_stalled" $OUT/ncu-stalls-$k.txt | sort -k3 -g -r | head -8
echo "== decode [t=$((SECONDS - t0))]"
bench llama8b llama-3.1-8b-4bit
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
