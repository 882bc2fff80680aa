#!/usr/bin/env bash
# GPU, 2026-12-06 (16), first call: qmm_ring (batched decode steps' 4-bit products with each
# warp's weights, scales and biases streamed through a 3-stage cp.async ring, x copied a chunk
# ahead, 168 registers: three blocks an SM where qmm_rows ran two) checked with the op cases
# (new batch cases at 3, 5, 6 and 7 tiles, a block with one live tile, splits longer than the
# ring) and the attention cases session 15 added; measured in serve's batched step against
# qmm_rows (MLXCEL_QMM_RING=0); Nsight on its 64-row launch; serve at 64 streams.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
echo "== default checks"
checks_in_full
echo "== batched steps: ring / qmm_rows [t=$((SECONDS - t0))]"
for n in 8 32 64; do
  batch $n
  batch $n MLXCEL_QMM_RING=0
done
echo "== ncu qmm_ring_f16_8 [t=$((SECONDS - t0))]"
ncu=$(ncu_bin)
timeout 120 $ncu -k regex:'^qmm_ring_f16_8$' --launch-skip 40 --launch-count 1 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
  --section WarpStateStats --section SchedulerStats \
  .gpu/bin/mlxcel bench --preset llama-3.1-8b-4bit --device cuda --batch 64 -p 256 -g 4 -r 1 > $OUT/ncu-qmm_ring_f16_8.txt 2>&1
echo "ncu rc=$?"
grep -E "qmm_ring|Duration|DRAM Throughput|Registers Per|Grid Size|Achieved Occupancy|Theoretical Occupancy|Block Limit|Warp Cycles Per Issued|Issued Warp|Eligible|Est. Speedup|stalled" $OUT/ncu-qmm_ring_f16_8.txt | head -30
COUNT=700 ncu_batch ring64 64
echo "== serve at 64 streams, warmed up [t=$((SECONDS - t0))]"
CONC=64 SERVE_S=100 bash scripts/gpu/serve-bench.sh
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
