#!/usr/bin/env bash
# GPU, 2026-12-06 (17): session 16's qmm_ring and qmm_ring_glu, and this session's qmm_ring3 (a
# batched step's q, k and v in one ring launch), checked with MLXCEL_QMM_RING=1 (op cases, fused
# patterns, parity), then serve's batched step at 8, 32 and 64 rows four ways: the ring with
# everything, without qmm_ring3 (MLXCEL_QMM_QKV=0), without the GLU launch (MLXCEL_QMM_GLU=0),
# and qmm_rows (MLXCEL_QMM_RING=0); serve's table at 1, 8, 32 and 64 streams with the ring;
# Nsight on the 64-row step if time is left. About 9 minutes warm.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
echo "== checks with the ring (MLXCEL_QMM_RING=1)"
MLXCEL_QMM_RING=1 checks_in_full
echo "== batched steps [t=$((SECONDS - t0))]"
for n in 64 32 8; do
  batch $n MLXCEL_QMM_RING=1
  batch $n MLXCEL_QMM_RING=1 MLXCEL_QMM_QKV=0
  batch $n MLXCEL_QMM_RING=1 MLXCEL_QMM_GLU=0
  batch $n MLXCEL_QMM_RING=0
done
echo "== serve, warmed up [t=$((SECONDS - t0))]"
MLXCEL_STEP_LOG=1 MLXCEL_QMM_RING=1 SERVE_S=200 bash scripts/gpu/serve-bench.sh
python3 scripts/gpu/step_log.py $OUT/serve.txt
echo "[t=$((SECONDS - t0))]"
if [ $((SECONDS - t0)) -lt 450 ]; then
  ncu_batch batch64-ring 64 MLXCEL_QMM_RING=1
fi
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
