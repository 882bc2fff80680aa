#!/usr/bin/env bash
# GPU, 2026-12-06 (16), a short call at the session's end: qmm_ring checked (op cases, fused
# patterns, parity with MLXCEL_QMM_RING=1) and serve's 64-row step three ways (ring and GLU, ring
# alone, qmm_rows). About 4 minutes warm.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
echo "== checks with the ring (MLXCEL_QMM_RING=1)"
MLXCEL_QMM_RING=1 checks_in_full
echo "== batched steps [t=$((SECONDS - t0))]"
for n in 64 32; do
  batch $n MLXCEL_QMM_RING=1
  batch $n MLXCEL_QMM_RING=1 MLXCEL_QMM_GLU=0
  batch $n MLXCEL_QMM_RING=0
done
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
