#!/usr/bin/env bash
# GPU, session 26's third call: after session26a/b (early attention won on the 8B presets, lost
# on qwen2.5-0.5b; q/k/v double-buffering lost on qwen3-8b, _db4/_db4a lost on llama), the early
# attention with the other opt-ins, qwen2.5-0.5b again; then what session26c.sh (prepared in
# session 25, removed once folded in here) would have run.
source "$(dirname "$0")/common.sh"
started_report
rlog "== llama-3.1-8b: early / early + q/k/v DB / early + raw norm [t=$((SECONDS - t0))]"
for i in 1 2; do
  rrun bench early$i llama-3.1-8b-4bit MLXCEL_PDL_ATTENTION=1
  rrun bench earlydb$i llama-3.1-8b-4bit MLXCEL_PDL_ATTENTION=1 MLXCEL_TC_DB_QKV=1
  rrun bench earlyraw$i llama-3.1-8b-4bit MLXCEL_PDL_ATTENTION=1 MLXCEL_ARN_RAW=1
done
rlog "== qwen2.5-0.5b / qwen3-8b raw: early / plain [t=$((SECONDS - t0))]"
for i in 1 2; do
  rrun bench early$i-q05 qwen2.5-0.5b-bf16 MLXCEL_PDL_ATTENTION=1
  rrun bench plain$i-q05 qwen2.5-0.5b-bf16
  rrun bench earlyraw$i-qwen3 qwen3-8b-4bit MLXCEL_PDL_ATTENTION=1 MLXCEL_ARN_RAW=1
done
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
