#!/usr/bin/env bash
# GPU, 2026-12-06 (16), not run in session 16 (no device could be started): qmm_ring (each warp's weights in a 3-stage cp.async ring, three blocks an
# SM) and qmm_ring_glu (a batched step's gate, up and act·mul in one launch) checked (op cases,
# fused patterns with batched GLUs, parity), measured in serve's batched step against the ring
# without the GLU (MLXCEL_QMM_GLU=0) and qmm_rows (MLXCEL_QMM_RING=0), then serve's table at 1,
# 8, 32 and 64 streams, and Nsight on the 64-row GLU if time is left. Every run names
# MLXCEL_QMM_RING (off by default until this script's checks pass).
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
echo "== checks with the ring (MLXCEL_QMM_RING=1)"
MLXCEL_QMM_RING=1 checks_in_full
echo "== batched steps: ring+glu / ring (QMM_GLU=0) / qmm_rows (QMM_RING=0) [t=$((SECONDS - t0))]"
for n in 8 32 64; do
  batch $n MLXCEL_QMM_RING=1
  batch $n MLXCEL_QMM_RING=1 MLXCEL_QMM_GLU=0
  batch $n MLXCEL_QMM_RING=0
done
echo "== serve, warmed up [t=$((SECONDS - t0))]"
MLXCEL_QMM_RING=1 SERVE_S=230 bash scripts/gpu/serve-bench.sh
echo "[t=$((SECONDS - t0))]"
if [ $((SECONDS - t0)) -lt 480 ]; then
  ncu=$(ncu_bin)
  MLXCEL_QMM_RING=1 timeout 60 $ncu -k regex:'^qmm_ring_glu_f16_8$' --launch-skip 20 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
    .gpu/bin/mlxcel bench --preset llama-3.1-8b-4bit --device cuda --batch 64 -p 256 -g 4 -r 1 > $OUT/ncu-qmm_ring_glu_f16_8.txt 2>&1
  echo "ncu rc=$?"
  grep -E "qmm_ring|Duration|DRAM Throughput|Registers Per|Grid Size|Achieved Occupancy|Block Limit Reg|Block Limit Sh|Warp Cycles Per Issued|Issued Warp|Eligible Warps" $OUT/ncu-qmm_ring_glu_f16_8.txt | head -20
fi
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
