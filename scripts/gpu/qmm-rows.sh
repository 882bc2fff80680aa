#!/usr/bin/env bash
# GPU: qmm_rows (the batched decode step's products) checked and measured in one call: the op
# cases and fused patterns (failures printed in full), serve's batched step at 8 and 64 rows with
# x staged a chunk ahead against at each chunk (MLXCEL_QMM_AHEAD=0), the 64-row step's profile,
# batch-1 decode of four presets (gemma3-1b against llama-3.2-1b, a dense model of about its
# bytes a token), and serve's table. One file back: $OUT/report.txt (and serve's files).
source "$(dirname "$0")/common.sh"
{
MLXCEL_REQUIRE_CUDA=1 timeout 150 .gpu/tests/gpu-test --test-threads 1 --skip every_kernel > /tmp/tests.txt 2>&1; echo "gpu-test rc=$?"
grep -E "test result|elements off|panicked|: " /tmp/tests.txt | grep -v "^\s*[0-9]*: " | head -30
MLXCEL_REQUIRE_CUDA=1 timeout 60 .gpu/tests/parity_cuda-test > /tmp/parity.txt 2>&1; echo "parity rc=$?"
grep -E "test result|panicked" /tmp/parity.txt | head -4
for n in 8 64; do batch $n; batch $n MLXCEL_QMM_AHEAD=0; done
tail -2 /tmp/bench.err
MLXCEL_CUDA_PROFILE=1 timeout 90 .gpu/bin/mlxcel bench --preset llama-3.1-8b-4bit --device cuda --batch 64 -p 256 -g 16 -r 1 > $OUT/profile-b64.txt 2>&1
echo "== profile, 64 rows rc=$?"; grep -v "^\s*$" $OUT/profile-b64.txt | sed -n 4,16p
for p in gemma3-1b-4bit llama-3.2-1b-4bit llama-3.1-8b-4bit qwen3-30b-a3b-4bit; do
  bench $p $p
  grep -o '"bytes_per_token[^,]*\|"achieved_gbps[^,]*' /tmp/$p.json | head -2 | tr '\n' ' '; echo
done
echo "== serve"; SERVE_S=170 timeout 250 bash scripts/gpu/serve-bench.sh
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
