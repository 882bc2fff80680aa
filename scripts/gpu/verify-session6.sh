#!/usr/bin/env bash
# GPU, first call after the 2026-12-04 (6) session: what landed unrun. Correctness with the
# defaults and with the ring GEMV + programmatic launch on (op cases, fused patterns, parity,
# the new CUDA batched-prefill check in parity_cuda), then serve's table with batched prefill
# (the default --max-prefill-tokens 2048) against one chunk a step (256), and sampled at 64
# streams. ring-min.sh is the
# second call. One file back: $OUT/report.txt (+ serve files).
source "$(dirname "$0")/common.sh"
{
gpu_checks
echo "== with MLXCEL_TC_RING=4 MLXCEL_PDL=1"; env MLXCEL_TC_RING=4 MLXCEL_PDL=1 bash -c "source scripts/gpu/common.sh; gpu_checks"
grep -E "^test .*(FAILED|failed)|prefill_chunks" /tmp/tests.txt /tmp/parity.txt | head
echo "== serve, batched prefill (default)"; SERVE_S=170 timeout 250 bash scripts/gpu/serve-bench.sh
echo "== serve, one prefill chunk a step"; SERVE_FLAGS="--max-prefill-tokens 256" SERVE_S=170 timeout 250 bash scripts/gpu/serve-bench.sh
echo "== serve, sampled (temperature 0.7, top_p 0.9: every row's logits go to the host)"; CONC=64 BENCH_FLAGS="--temperature 0.7 --top-p 0.9" SERVE_S=100 timeout 150 bash scripts/gpu/serve-bench.sh
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
