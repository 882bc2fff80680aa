#!/usr/bin/env bash
# GPU, 2026-12-07 (18), first call: the tensor-core dequantization with fewer instructions
# (odd nibbles masked in place, one LOP3 a pair, chunk offsets made once) checked and measured
# side by side against the build before it (.gpu/old, 708a52a); serve's table with the
# benchmark's clients sending together and the engine gathering a burst, with the step log;
# then more presets, the GLU launch's fix and the batched attention aimed at 2048 blocks.
# In order of need (a call cut short still returns its report so far). About 6 minutes.
# (It ran as call 1 with these helpers written inline; they are now common.sh's rlog, rrun, old_new.)
source "$(dirname "$0")/common.sh"
unpack_ptx
t0=$SECONDS
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader > $OUT/report.txt
rlog "== checks (new build)"
rrun checks_in_full
rlog "== decode, old / new / old / new [t=$((SECONDS - t0))]"
old_new 2 llama-3.1-8b-4bit qwen3-8b-4bit
rlog "== 64-row step old / new [t=$((SECONDS - t0))]"
timeout 90 .gpu/old/mlxcel bench --preset llama-3.1-8b-4bit --device cuda --batch 64 -p 256 -g 64 -r 2 --json > /tmp/batch.json 2>> /tmp/bench.err
rlog "old batch 64 $(grep -o '"aggregate_tps_mean"[^,]*' /tmp/batch.json) $(grep -o '"ms_per_step_mean"[^,}]*' /tmp/batch.json)"
rrun batch 64
rlog "== serve (new build) [t=$((SECONDS - t0))]"
rrun serve_steps SERVE_S=200
rlog "== more decode [t=$((SECONDS - t0))]"
old_new 1 llama-3.2-1b-4bit qwen3-30b-a3b-4bit
rlog "== fused patterns with MLXCEL_QMM_GLU=1 [t=$((SECONDS - t0))]"
MLXCEL_QMM_GLU=1 MLXCEL_REQUIRE_CUDA=1 timeout 100 .gpu/tests/gpu-test fused_decode_patterns > /tmp/glu.txt 2>&1; rlog "rc=$?"
grep -E "test result|panicked" -A3 /tmp/glu.txt | head -8 >> $OUT/report.txt
rlog "== 64-row step, attention aiming at 2048 blocks [t=$((SECONDS - t0))]"
rrun batch 64 MLXCEL_ATT_BATCH_BLOCKS=2048
rlog "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err >> $OUT/report.txt
cat $OUT/report.txt
