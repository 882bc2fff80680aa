#!/usr/bin/env bash
# GPU, session 26's third call: the dense 8B step under switches that earlier sessions
# measured on older kernels (every tensor-core GEMV programmatic, blocks sized to equal tile
# counts, the cp.async ring); and where the batch-1 GLU's warps stall, instruction by
# instruction (Nsight Compute's source page, SASS, on gemv_throughput's GLU), into
# $OUT/ncu-src-glu.csv.gz.
source "$(dirname "$0")/common.sh"
started_report
rlog "== llama-3.1-8b: PDL all / persist 2 / ring 4 + PDL / plain [t=$((SECONDS - t0))]"
for i in 1 2; do
  rrun bench pdl$i llama-3.1-8b-4bit MLXCEL_PDL=1
  rrun bench persist2-$i llama-3.1-8b-4bit MLXCEL_TC_PERSIST=2
  rrun bench ring4-$i llama-3.1-8b-4bit MLXCEL_TC_RING=4 MLXCEL_PDL=1
  rrun bench plain$i llama-3.1-8b-4bit
done
rlog "== GLU source-level stalls [t=$((SECONDS - t0))]"
timeout 150 $(ncu_bin) -k regex:'^tc_qglu_f16_4' --launch-skip 2 --launch-count 1 \
  --section WarpStateStats --section SourceCounters --page source --print-source sass --csv \
  .gpu/tests/gpu-test gemv_throughput --ignored --nocapture > /tmp/ncu-src-glu.csv 2> /tmp/ncu-src.err
rlog "ncu source rc=$? lines=$(wc -l < /tmp/ncu-src-glu.csv)"
rrun tail -3 /tmp/ncu-src.err
gzip -c /tmp/ncu-src-glu.csv > $OUT/ncu-src-glu.csv.gz
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
