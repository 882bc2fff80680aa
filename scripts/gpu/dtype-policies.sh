#!/usr/bin/env bash
# GPU call 2: tests, then decode speed and AsType per step under native / auto / bf16.
cd "$(dirname "$0")/../.."
lib=$(dirname "$(find / -name 'libcublas.so.1*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}" MLXCEL_TEST_ROOT=$PWD MLXCEL_CACHE_DIR=/tmp/mlxcel-cache
if [ "${TESTS:-1}" = 1 ]; then
  for t in .gpu/tests/*; do
    echo "=== $t" >> $OUT/tests.txt
    MLXCEL_REQUIRE_CUDA=1 timeout 240 "$t" --test-threads 1 --nocapture >> $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt
  done
  grep -E "^=== |rc=|test result|differ|FAILED|panicked|under" $OUT/tests.txt | head -80
fi
export MLXCEL=.gpu/bin/mlxcel MLXCEL_TRACE_DTYPE=1
P=${PRESETS:-llama-3.1-8b-4bit,qwen3-8b-4bit,qwen3-30b-a3b-4bit,qwen2.5-0.5b-bf16}
for pol in ${POLICIES:-native auto bf16}; do
  timeout 200 bash scripts/bench_representative.sh -o $OUT/bench-$pol.md --only $P -- --device cuda --dtype $pol -p 512 -g 128 -r 3 2>> $OUT/bench.err >/dev/null
  cat $OUT/bench-$pol.md
done
for pol in native auto; do
  timeout 60 .gpu/bin/mlxcel bench --preset llama-3.1-8b-4bit --f32-norms --device cuda --dtype $pol -p 512 -g 128 -r 3 --json 2>>$OUT/bench.err | tail -1 >> $OUT/f32norms.jsonl
done
# The tracing's cost: the same bench without MLXCEL_TRACE_DTYPE.
MLXCEL_TRACE_DTYPE= timeout 60 .gpu/bin/mlxcel bench --preset llama-3.1-8b-4bit --device cuda --dtype auto -p 512 -g 128 -r 3 --json 2>>$OUT/bench.err | tail -1 > $OUT/notrace.json
python3 -c "
import json
for l in open('$OUT/f32norms.jsonl'): r=json.loads(l); print('f32norms', r.get('dtype_policy'), r.get('dtype'), r.get('decode_tps_mean'), r.get('astype_per_step'))
r=json.load(open('$OUT/notrace.json')); print('notrace', r.get('decode_tps_mean'), r.get('decode_tps_std'))
"
tail -3 $OUT/bench.err
