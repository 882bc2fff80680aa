#!/usr/bin/env bash
# GPU: the ring GEMV (tc_qring: each warp's weights streamed through shared-memory stages by
# cp.async). Correctness (op cases, fused patterns, parity, ring on by default), then decode
# tok/s side by side: ring off (MLXCEL_TC_RING=0), programmatic launch off (MLXCEL_PDL=0),
# stages and warps a block, four presets;
# Nsight Compute on the ring's down projection and GLU; the batch-1 profile. One file back:
# $OUT/report.txt (+ ncu-*.txt, profile-b1.txt).
source "$(dirname "$0")/common.sh"
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
{
gpu_checks
grep -E "^test .*(FAILED|failed)" /tmp/tests.txt | head
# Programmatic launch is a race if anything reads before pdl_wait: the same kernels with and
# without it must give the very same tokens (greedy, a synth llama-3.2-1b-4bit); the old kernel
# may differ from the first near-tie on.
.gpu/bin/mlxcel synth --preset llama-3.2-1b-4bit --out /tmp/l1b --force > /dev/null 2>&1
toks=$(seq -s, 1 200)
for v in MLXCEL_X=1 MLXCEL_PDL=0 MLXCEL_TC_RING=0; do
  env $v timeout 60 .gpu/bin/mlxcel generate -m /tmp/l1b --device cuda --prompt-tokens $toks -n 96 --json > /tmp/gen-$v.json 2>>/tmp/gen.err
  echo "generate $v rc=$? $(python3 -c "import json,sys; d=json.load(open('/tmp/gen-$v.json')); t=d.get('tokens') or d.get('token_ids') or d.get('text'); print(len(t), str(t)[:60])")"
done
python3 - <<'PY'
import json
d = {v: json.load(open(f"/tmp/gen-{v}.json")) for v in ["MLXCEL_X=1", "MLXCEL_PDL=0", "MLXCEL_TC_RING=0"]}
key = next(k for k in ("tokens", "token_ids", "text") if k in d["MLXCEL_X=1"])
a, b, c = (d[v][key] for v in d)
same = lambda x, y: next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
print(f"ring+pdl vs ring: identical={a == b}; vs old kernel: first difference at {same(a, c)} of {len(a)}")
PY
tail -2 /tmp/gen.err
bench llama-ring llama-3.1-8b-4bit
bench llama-nopdl llama-3.1-8b-4bit MLXCEL_PDL=0
bench llama-off llama-3.1-8b-4bit MLXCEL_TC_RING=0
for s in 2 6; do bench llama-ring$s llama-3.1-8b-4bit MLXCEL_TC_RING=$s; done
for w in 2 16; do bench llama-warps$w llama-3.1-8b-4bit MLXCEL_RING_WARPS=$w; done
for p in qwen3-8b-4bit gemma3-1b-4bit llama-3.2-1b-4bit; do
  bench $p-ring $p; bench $p-off $p MLXCEL_TC_RING=0
done
tail -3 /tmp/bench.err
for spec in "down proj:tc_qgemv_f16_4_ring" "gate+up (fused GLU):tc_qglu_f16_4_ring"; do
  shape=${spec%%:*}; k=${spec##*:}; f=$OUT/ncu-${shape%% *}.txt
  MLXCEL_GEMV_SHAPES="$shape" timeout 100 $ncu --clock-control none -k regex:"^$k\$" --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio,dram__bytes_read.sum \
    .gpu/tests/gpu-test gemv_throughput --ignored --nocapture > $f 2>&1
  echo "== ncu $shape ($k) rc=$?"
  grep -E "Duration|DRAM Throughput|Registers Per|Block Size|Grid Size|Dynamic Shared|Achieved Occupancy|Theoretical Occupancy|Issued Warp|No Eligible|Warp Cycles Per Issued|dram__bytes|stalled" $f | grep -v " 0$\| 0\.0[0-9]$" | head -30
done
MLXCEL_CUDA_PROFILE=1 timeout 90 .gpu/bin/mlxcel bench --preset llama-3.1-8b-4bit --device cuda -p 512 -g 32 -r 1 > $OUT/profile-b1.txt 2>&1
echo "== profile batch 1 rc=$?"; sed -n '/graph 1/,$p' $OUT/profile-b1.txt | head -16
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
