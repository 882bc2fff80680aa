#!/usr/bin/env bash
# GPU: mlxcel serve on a synth llama-3.1-8b-4bit folder, aggregate throughput at several concurrencies
# (SERVE_FLAGS: more serve flags, e.g. --max-prefill-tokens 256; BENCH_FLAGS: the client's, e.g.
# --temperature 0.7 --top-p 0.9).
cd "$(dirname "$0")/../.."
lib=$(dirname "$(find / -name 'libcublas.so.1*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}" MLXCEL_CACHE_DIR=/tmp/mlxcel-cache
[ -f /tmp/m8b/config.json ] || .gpu/bin/mlxcel synth --preset llama-3.1-8b-4bit --out /tmp/m8b --force > $OUT/synth.txt 2>&1
.gpu/bin/mlxcel serve -m /tmp/m8b --device cuda --port 8093 --max-batch-size 64 --max-kv-tokens 40000 ${SERVE_FLAGS:-} > $OUT/serve.txt 2>&1 &
pid=$!
for i in $(seq 60); do curl -s http://127.0.0.1:8093/health > /dev/null && break; sleep 1; done
timeout ${SERVE_S:-200} python3 scripts/bench_serve.py --url http://127.0.0.1:8093 --concurrency ${CONC:-1,8,32,64} --prompt 256 --max-tokens 256 ${BENCH_FLAGS:-} > $OUT/serve-bench.md 2>&1
kill $pid; wait $pid 2>/dev/null; cat $OUT/serve-bench.md | tail -15; tail -3 $OUT/serve.txt
