#!/usr/bin/env bash
# GPU: the ring GEMV (tc_qring: each warp's weights streamed through shared-memory stages by
# cp.async) and programmatic dependent launch of the tensor-core GEMVs (MLXCEL_PDL=0: off).
# Correctness (op cases, fused patterns, parity), identical greedy tokens with and without
# programmatic launch, then decode tok/s side by side: ring (default 2 stages) against the
# one-chunk kernel (MLXCEL_TC_RING=0), each with and without programmatic launch, stage counts,
# four presets. One file back: $OUT/report.txt.
source "$(dirname "$0")/common.sh"
# The defaults when it was measured (5901933): ring of 2 stages, programmatic launch on.
export MLXCEL_TC_RING=${MLXCEL_TC_RING:-2} MLXCEL_PDL=${MLXCEL_PDL:-1}
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
{
gpu_checks
grep -E "^test .*(FAILED|failed)" /tmp/tests.txt | head
# Programmatic launch is a race if anything reads before pdl_wait: the same kernels with and
# without it must give the very same tokens (greedy, a synth llama-3.2-1b-4bit).
.gpu/bin/mlxcel synth --preset llama-3.2-1b-4bit --out /tmp/l1b --force > /dev/null 2>&1
toks=$(seq -s, 1 200)
for v in ring ring-nopdl old old-nopdl; do
  case $v in ring) e=MLXCEL_X=1;; ring-nopdl) e=MLXCEL_PDL=0;; old) e=MLXCEL_TC_RING=0;; old-nopdl) e="MLXCEL_TC_RING=0 MLXCEL_PDL=0";; esac
  env $e timeout 60 .gpu/bin/mlxcel generate -m /tmp/l1b --device cuda --prompt-tokens $toks -n 96 --json > /tmp/gen-$v.json 2>>/tmp/gen.err
  echo "generate $v rc=$?"
done
python3 - <<'PY'
import json
t = {v: json.load(open(f"/tmp/gen-{v}.json"))["tokens"] for v in ["ring", "ring-nopdl", "old", "old-nopdl"]}
diff = lambda x, y: next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), None)
print(f"tokens: ring with/without PDL identical={t['ring'] == t['ring-nopdl']}, old with/without PDL identical={t['old'] == t['old-nopdl']}; ring vs old first difference at {diff(t['ring'], t['old'])} of {len(t['ring'])}; distinct tokens {len(set(t['ring']))}")
PY
bench llama-ring2 llama-3.1-8b-4bit
bench llama-ring2-nopdl llama-3.1-8b-4bit MLXCEL_PDL=0
bench llama-ring4 llama-3.1-8b-4bit MLXCEL_TC_RING=4
bench llama-ring4-nopdl llama-3.1-8b-4bit MLXCEL_TC_RING=4 MLXCEL_PDL=0
bench llama-ring3 llama-3.1-8b-4bit MLXCEL_TC_RING=3
bench llama-old llama-3.1-8b-4bit MLXCEL_TC_RING=0
bench llama-old-nopdl llama-3.1-8b-4bit MLXCEL_TC_RING=0 MLXCEL_PDL=0
for p in qwen3-8b-4bit gemma3-1b-4bit llama-3.2-1b-4bit; do
  bench $p-ring2 $p; bench $p-ring4 $p MLXCEL_TC_RING=4; bench $p-old-nopdl $p MLXCEL_TC_RING=0 MLXCEL_PDL=0
done
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
