#!/usr/bin/env bash
# GPU, first call after the 2026-12-04 (6) session: what landed unrun, most important first, so a
# cut-short call still brings back the figures that matter. Correctness with the defaults (op
# cases, fused patterns, parity, the CUDA batched-prefill check in parity_cuda); serve's table
# with batched prefill (the default --max-prefill-tokens 2048); sampled at 64 streams (every
# row's logits go to the host); then correctness with the ring GEMV, programmatic launch and the
# online decode attention on; one prefill chunk a step (256) at 64 streams for comparison.
# ring-min.sh is the second call. One file back: $OUT/report.txt (+ serve files).
source "$(dirname "$0")/common.sh"
{
t0=$SECONDS
gpu_checks
grep -E "prefill_chunks|unload" /tmp/tests.txt /tmp/parity.txt | head
echo "== serve, batched prefill (default) [t=$((SECONDS - t0))]"; SERVE_S=150 timeout 220 bash scripts/gpu/serve-bench.sh
cp $OUT/serve.txt $OUT/serve-default.txt
echo "== serve, sampled (temperature 0.7, top_p 0.9) [t=$((SECONDS - t0))]"; CONC=64 BENCH_FLAGS="--temperature 0.7 --top-p 0.9" SERVE_S=60 timeout 90 bash scripts/gpu/serve-bench.sh
echo "== checks with MLXCEL_TC_RING=4 MLXCEL_PDL=1 MLXCEL_ATT_ONLINE=1 [t=$((SECONDS - t0))]"
env MLXCEL_TC_RING=4 MLXCEL_PDL=1 MLXCEL_ATT_ONLINE=1 bash -c "source scripts/gpu/common.sh; gpu_checks"
grep -E "^test .*(FAILED|failed)" /tmp/tests.txt /tmp/parity.txt | head
echo "== serve, one prefill chunk a step [t=$((SECONDS - t0))]"; CONC=64 SERVE_FLAGS="--max-prefill-tokens 256" SERVE_S=60 timeout 90 bash scripts/gpu/serve-bench.sh
echo "[t=$((SECONDS - t0))]"
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
