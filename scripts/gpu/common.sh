# Sourced by the GPU-machine scripts: the repo root as working directory, cuBLAS and the PTX
# cache found, and the steps several scripts share. Not a script of its own.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
lib=$(dirname "$(find / -name 'libcublas.so.1*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}" MLXCEL_CACHE_DIR=/tmp/mlxcel-cache MLXCEL_TEST_ROOT=$PWD
mkdir -p "$MLXCEL_CACHE_DIR"; cp .gpu/extra/ptx-*.ptx "$MLXCEL_CACHE_DIR"/ 2>/dev/null

# Op cases and fused patterns (gpu-test), then parity_cuda: exit codes and summary lines.
gpu_checks() {
  MLXCEL_REQUIRE_CUDA=1 timeout 150 .gpu/tests/gpu-test --test-threads 1 --skip every_kernel > /tmp/tests.txt 2>&1; echo "gpu-test rc=$?"
  grep -E "test result|differ|panicked|FAIL|mismatch|case" /tmp/tests.txt | head -30
  MLXCEL_REQUIRE_CUDA=1 timeout 120 .gpu/tests/parity_cuda-test > /tmp/parity.txt 2>&1; echo "parity rc=$?"
  grep -E "test result|panicked|FAIL" /tmp/parity.txt | head
}

# The same checks with failures in full: each panic's first lines too, and parity_cuda
# PARITY_RUNS times (default 1).
checks_in_full() {
  local r
  MLXCEL_REQUIRE_CUDA=1 timeout 170 .gpu/tests/gpu-test --test-threads 1 --skip every_kernel > /tmp/tests.txt 2>&1; echo "gpu-test rc=$?"
  grep -E "test result|FAILED" /tmp/tests.txt | head
  grep -A20 "panicked" /tmp/tests.txt | head -60
  for r in $(seq "${PARITY_RUNS:-1}"); do
    MLXCEL_REQUIRE_CUDA=1 timeout 120 .gpu/tests/parity_cuda-test > /tmp/parity.txt 2>&1; echo "parity rc=$?"
    grep -E "test result|panicked" -A3 /tmp/parity.txt | head
  done
}

# bench NAME PRESET [VAR=VALUE ...]: decode (and prefill) tok/s of a preset under those variables.
bench() {
  local name=$1 preset=$2; shift 2
  env "$@" timeout 60 .gpu/bin/mlxcel bench --preset $preset --device cuda -p 512 -g 128 -r 2 --json > /tmp/$name.json 2>> /tmp/bench.err
  echo "$name $(grep -o '"decode_tps_mean"[^,]*' /tmp/$name.json) $(grep -o '"decode_tps_std"[^,]*' /tmp/$name.json) $(grep -o '"prefill_tps_mean"[^,]*' /tmp/$name.json)"
}

# batch N [VAR=VALUE ...]: serve's batched step of N rows on the 8B preset (rows as if prefilled
# to 256 positions, 64 steps, 2 runs) under those variables: aggregate tok/s and ms a step.
batch() {
  local n=$1; shift
  env "$@" timeout 90 .gpu/bin/mlxcel bench --preset llama-3.1-8b-4bit --device cuda --batch $n -p 256 -g 64 -r 2 --json > /tmp/batch.json 2>> /tmp/bench.err
  echo "batch $n $* $(grep -o '"aggregate_tps_mean"[^,]*' /tmp/batch.json) $(grep -o '"ms_per_step_mean"[^,}]*' /tmp/batch.json)"
}

# The representative sweep of six presets (3 runs each) into /tmp/sweep.md, printed.
sweep() {
  MLXCEL=.gpu/bin/mlxcel MLXCEL_COMMIT=${COMMIT:-wip} timeout 240 bash scripts/bench_representative.sh -o /tmp/sweep.md \
    --only llama-3.1-8b-4bit,qwen3-8b-4bit,qwen3-30b-a3b-4bit,qwen2.5-0.5b-bf16,gemma3-1b-4bit,llama-3.2-1b-4bit -- --device cuda -p 512 -g 128 -r ${SWEEP_R:-3} 2> /tmp/bench.err >/dev/null
  cat /tmp/sweep.md; tail -2 /tmp/bench.err
}

# ncu_bin: Nsight Compute's command line tool, on PATH or where the CUDA images install it.
ncu_bin() {
  command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1
}

# prefill_kernels PRESET [LINES]: where a 512-token prefill's time goes, kernel by kernel (Nsight
# Compute, duration only, no cache flush): `bench -p 512 -g 1 -r 1` is a warm-up and one measured
# run, so run_kernels.py halves the sums. Into $OUT/prefill-PRESET.md, its first LINES (default
# 30) printed; the log stays at /tmp/ncu-prefill-PRESET.csv.
prefill_kernels() {
  local p=$1
  timeout 200 $(ncu_bin) --csv --metrics gpu__time_duration.sum --cache-control none --clock-control none \
    --log-file /tmp/ncu-prefill-$p.csv .gpu/bin/mlxcel bench --preset $p --device cuda -p 512 -g 1 -r 1 \
    > /tmp/prefill-$p.txt 2>> /tmp/ncu.err
  echo "== prefill kernels $p rc=$?"
  python3 scripts/gpu/run_kernels.py /tmp/ncu-prefill-$p.csv --runs 2 > $OUT/prefill-$p.md 2>&1
  head -${2:-30} $OUT/prefill-$p.md
}

# ncu_gemv KERNEL...: Nsight Compute on each kernel's third launch in gpu-test gemv_throughput
# (what bounds it), into $OUT/ncu-KERNEL.txt, with the key lines printed.
ncu_gemv() {
  local ncu k
  ncu=$(ncu_bin)
  for k in "$@"; do
    timeout 90 $ncu -k regex:"^$k\$" --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
      --section WarpStateStats --section SchedulerStats \
      .gpu/tests/gpu-test gemv_throughput --ignored --nocapture > $OUT/ncu-$k.txt 2>&1
    echo "== ncu $k rc=$?"
    grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Hit|Registers Per|Block Size|Grid Size|Achieved Occupancy|Theoretical Occupancy|Block Limit|Warp Cycles Per Issued|Issued Warp|No Eligible|Stall|ERR|shape" $OUT/ncu-$k.txt | head -30
  done
}

# unpack_ptx: the gzipped PTX caches (.gpu/extra/ptx-*.ptx.gz, and .gpu/old's, the build a change
# is measured against, as ptx.gz + ptx.name or as restage.sh's ptx-*.gz) into the cache
# directory, with the cubin ptxas made of it where staged (ptx-*.cubin.gz: the driver then need
# not compile the PTX, about 70 s cold).
unpack_ptx() {
  local f
  for f in .gpu/extra/ptx-*.gz; do [ -f "$f" ] && gunzip -c "$f" > "$MLXCEL_CACHE_DIR/$(basename "${f%.gz}")"; done
  [ -f .gpu/old/ptx.gz ] && gunzip -c .gpu/old/ptx.gz > "$MLXCEL_CACHE_DIR/$(cat .gpu/old/ptx.name)"
  for f in .gpu/old/ptx-*.gz; do [ -f "$f" ] && gunzip -c "$f" > "$MLXCEL_CACHE_DIR/$(basename "${f%.gz}")"; done
  return 0
}

# old NAME PRESET [VAR=VALUE ...]: bench with the build before the change (.gpu/old/mlxcel).
old() {
  local name=$1 preset=$2; shift 2
  env "$@" timeout 60 .gpu/old/mlxcel bench --preset $preset --device cuda -p 512 -g 128 -r 2 --json > /tmp/$name.json 2>> /tmp/bench.err
  echo "$name $(grep -o '"decode_tps_mean"[^,]*' /tmp/$name.json) $(grep -o '"decode_tps_std"[^,]*' /tmp/$name.json) $(grep -o '"prefill_tps_mean"[^,]*' /tmp/$name.json)"
}

# ncu_step NAME PRESET [VAR=VALUE ...]: each kernel of a replayed decode step timed by Nsight
# Compute (duration only, no cache flush), summed by step_kernels.py into $OUT/step-NAME.md.
# The prompt is P tokens (default 64).
ncu_step() {
  local name=$1 preset=$2 ncu; shift 2
  ncu=$(ncu_bin)
  env "$@" timeout 150 $ncu --csv --metrics gpu__time_duration.sum --cache-control none --clock-control none \
    --launch-skip ${SKIP:-3000} --launch-count ${COUNT:-2500} --log-file /tmp/ncu-$name.csv \
    .gpu/bin/mlxcel bench --preset $preset --device cuda -p ${P:-64} -g 40 -r 1 > /dev/null 2>> /tmp/ncu.err
  echo "== ncu step $name rc=$?"
  python3 scripts/gpu/step_kernels.py /tmp/ncu-$name.csv --full $OUT/step-$name.tsv > $OUT/step-$name.md 2>&1
  head -22 $OUT/step-$name.md
}

# nsys_step NAME PRESET [VAR=VALUE ...]: the replayed decode step as its kernels really ran,
# overlapping (Nsight Systems, the graph's nodes traced one by one), summed by timeline.py into
# $OUT/timeline-NAME.md: each family's time a launch and the part of the step it exposed. The
# prompt is P tokens (default 64). A notice where the machine has no nsys.
nsys_step() {
  local name=$1 preset=$2 nsys; shift 2
  nsys=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems*/*/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null | head -1)
  if [ -z "$nsys" ]; then echo "== nsys step $name: no nsys on this machine"; return; fi
  env "$@" timeout 150 $nsys profile --trace=cuda --cuda-graph-trace=node --force-overwrite true -o /tmp/nsys-$name \
    .gpu/bin/mlxcel bench --preset $preset --device cuda -p ${P:-64} -g 40 -r 1 > /dev/null 2>> /tmp/nsys.err
  echo "== nsys step $name rc=$?"
  timeout 120 $nsys stats --report cuda_gpu_trace --format csv --force-export true --output /tmp/nsys-$name \
    /tmp/nsys-$name.nsys-rep > /dev/null 2>> /tmp/nsys.err
  python3 scripts/gpu/timeline.py "$(ls /tmp/nsys-$name*cuda_gpu_trace*.csv | head -1)" > $OUT/timeline-$name.md 2>&1
  head -24 $OUT/timeline-$name.md
}

# ncu_batch NAME N [VAR=VALUE ...]: ncu_step for serve's batched step of N rows on the 8B preset
# (rows at position 256, a warm-up and one run of 4 steps).
ncu_batch() {
  local name=$1 n=$2 ncu; shift 2
  ncu=$(ncu_bin)
  env "$@" timeout 150 $ncu --csv --metrics gpu__time_duration.sum --cache-control none --clock-control none \
    --launch-skip 0 --launch-count ${COUNT:-1500} --log-file /tmp/ncu-$name.csv \
    .gpu/bin/mlxcel bench --preset llama-3.1-8b-4bit --device cuda --batch $n -p 256 -g 4 -r 1 > /dev/null 2>> /tmp/ncu.err
  echo "== ncu batch $name rc=$?"
  python3 scripts/gpu/step_kernels.py /tmp/ncu-$name.csv --full $OUT/step-$name.tsv > $OUT/step-$name.md 2>&1
  head -22 $OUT/step-$name.md
}

# ncu_stalls KERNEL...: Nsight Compute's warp-stall reasons (average warps stalled per issued
# instruction, by reason) for each kernel's third launch in gpu-test gemv_throughput, into
# $OUT/ncu-stalls-KERNEL.txt, with the key lines and the largest reasons printed.
ncu_stalls() {
  local ncu k
  ncu=$(ncu_bin)
  for k in "$@"; do
    timeout 100 $ncu -k regex:"^$k\$" --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
      --metrics regex:'smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
      .gpu/tests/gpu-test gemv_throughput --ignored --nocapture > $OUT/ncu-stalls-$k.txt 2>&1
    echo "== ncu $k rc=$?"
    grep -E "Duration|DRAM Throughput|Registers Per|Block Size|Grid Size|Achieved Occupancy|Warp Cycles Per Issued|Issued Warp|Eligible Warps" $OUT/ncu-stalls-$k.txt | head -12
    grep -E "issue_stalled" $OUT/ncu-stalls-$k.txt | sort -k3 -g -r | head -8
  done
}

# serve_steps [VAR=VALUE ...]: serve-bench.sh (CONC, SERVE_S as there) with the engine's step
# log, then its prefill steps and the 1, 8, 32 and 64-row decode steps summarized.
serve_steps() {
  env MLXCEL_STEP_LOG=1 "$@" bash scripts/gpu/serve-bench.sh
  python3 scripts/gpu/step_log.py $OUT/serve.txt | grep -E "prefill|decode (1|8|32|64) rows"
}

# A script's report written as it goes, so a call cut short still returns what it measured:
# rlog TEXT appends a line to $OUT/report.txt, rrun CMD... appends a command's output.
rlog() { echo "$*" >> $OUT/report.txt; }
rrun() { "$@" >> $OUT/report.txt 2>&1; }

# started_report: how a measuring script starts. The kernels' cache unpacked, the GPU's name
# as the report's first line; t0 set for elapsed times (`[t=$((SECONDS - t0))]`).
started_report() {
  unpack_ptx
  t0=$SECONDS
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $OUT/report.txt
}

# checked_report: started_report, then the checks of the build under the GPU's name.
checked_report() {
  started_report
  rlog "== checks"
  rrun checks_in_full
}

# gemma_check ROUNDS: issue 7's Gemma check into the report, gemma3-1b against its Llama twin
# (the same bytes a token), alternating, ROUNDS times.
gemma_check() {
  local i
  rlog "== issue 7's Gemma check: gemma3-1b against its Llama twin [t=$((SECONDS - t0))]"
  for i in $(seq "$1"); do
    rrun bench gemma$i gemma3-1b-4bit
    rrun bench twin$i llama-as-gemma3-1b-4bit
  done
}

# old_new ROUNDS PRESET...: decode of each preset with the build before a change (.gpu/old) and
# after it, alternating, ROUNDS times each, into the report.
old_new() {
  local rounds=$1 p i; shift
  for p in "$@"; do
    for i in $(seq "$rounds"); do rrun old "old$i-$p" $p; rrun bench "new$i-$p" $p; done
  done
}

# ncu_mix KERNEL...: where each kernel's instructions and bytes go (third launch in gpu-test
# gemv_throughput): instructions by pipe, global load requests and sectors, L2 and DRAM bytes,
# into $OUT/ncu-mix-KERNEL.txt, printed.
ncu_mix() {
  local ncu k
  ncu=$(ncu_bin)
  for k in "$@"; do
    timeout 100 $ncu -k regex:"^$k\$" --launch-skip 2 --launch-count 1 --section InstructionStats \
      --metrics gpu__time_duration.sum,smsp__inst_executed.sum,smsp__thread_inst_executed.sum,sm__inst_executed_pipe_alu.sum,sm__inst_executed_pipe_fma.sum,sm__inst_executed_pipe_lsu.sum,sm__inst_executed_pipe_tensor.sum,sm__inst_executed_pipe_uniform.sum,sm__inst_executed_pipe_adu.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active \
      .gpu/tests/gpu-test gemv_throughput --ignored --nocapture > $OUT/ncu-mix-$k.txt 2>&1
    echo "== ncu mix $k rc=$?"
    grep -E "^\s+(gpu__|smsp__|sm__|l1tex__|lts__|dram__)|Executed Ipc|Issue Slots" $OUT/ncu-mix-$k.txt | head -24
  done
}
