#!/usr/bin/env bash
# GPU, 2026-12-06 (15), after attention_lanes became the default per-head decode attention:
# the default checks (timed: the staged cubin should spare the driver's 70 s compile on a cold
# machine), and the checks with the lanes kernel taking 4 query heads a block
# (MLXCEL_ATT_LANES_GROUP=1, attention_lanes_g4_*, new, off by default); then decode of the
# presets whose groups are multiples of 4 three ways: as they are (the grouped attention_gqa_*
# at 128 and 256 channels, per-head lanes at 64 and for groups of 8), per-head lanes everywhere
# (MLXCEL_ATT_GQA=0), and 4 heads a block; the same for serve's 64-row step; then Nsight steps
# of serve's 64-row step, and what bounds its products and attention; serve at 64 streams with
# 2048 and 8192 prompt tokens a step.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
echo "== default checks (cache: $(ls $MLXCEL_CACHE_DIR))"
checks_in_full
echo "== checks with MLXCEL_ATT_LANES_GROUP=1 [t=$((SECONDS - t0))]"
MLXCEL_ATT_LANES_GROUP=1 checks_in_full
echo "== as is / per-head lanes (MLXCEL_ATT_GQA=0) / 4 heads a block (MLXCEL_ATT_LANES_GROUP=1) [t=$((SECONDS - t0))]"
for p in llama-3.1-8b-4bit qwen3-8b-4bit gemma3-1b-4bit llama-as-gemma3-1b-4bit qwen3-30b-a3b-4bit llama-3.2-1b-4bit; do
  bench "$p-asis" $p
  bench "$p-perhead" $p MLXCEL_ATT_GQA=0
  bench "$p-g4" $p MLXCEL_ATT_LANES_GROUP=1
done
bench "q05" qwen2.5-0.5b-bf16
echo "== serve's 64-row step [t=$((SECONDS - t0))]"
batch 64
batch 64 MLXCEL_ATT_GQA=0
batch 64 MLXCEL_ATT_LANES_GROUP=1
echo "== serve at 64 streams, warmed up: 2048 prompt tokens a step (default), then 8192 [t=$((SECONDS - t0))]"
CONC=64 SERVE_S=100 bash scripts/gpu/serve-bench.sh
CONC=64 SERVE_S=100 SERVE_FLAGS="--max-prefill-tokens 8192" bash scripts/gpu/serve-bench.sh
echo "== steps [t=$((SECONDS - t0))]"
ncu_batch batch64 64
echo "== what bounds qmm_rows and the paged attention in the 64-row step [t=$((SECONDS - t0))]"
for k in qmm_rows_f16_8 attention_gqa_paged_4; do
  timeout 90 $(ncu_bin) -k regex:"^$k\$" --launch-skip 40 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats \
    .gpu/bin/mlxcel bench --preset llama-3.1-8b-4bit --device cuda --batch 64 -p 256 -g 4 -r 1 > $OUT/ncu-$k.txt 2>&1
  echo "== ncu $k rc=$?"
  grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Hit|Registers Per|Grid Size|Achieved Occupancy|Theoretical Occupancy|Block Limit|Warp Cycles Per Issued|Issued Warp|No Eligible|Stall|Compute \(SM\)" $OUT/ncu-$k.txt | head -30
done
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
