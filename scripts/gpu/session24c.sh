#!/usr/bin/env bash
# GPU, session 24 (2026-12-07), call 3: the build of e0f4134 (.gpu/old: the router in the
# routed GLU, the down product with the combine in a cluster; call 2 found the programmatic
# routed launches and add_rms_norm's early weight loads slower, reverted). qwen3-30b-a3b decode
# with the combine / MLXCEL_CUDA_FUSE_DOWN=0, alternating, three rounds; then the sweep of that
# build (2 runs each).
source "$(dirname "$0")/common.sh"
unpack_ptx
t0=$SECONDS
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $OUT/report.txt
rlog "== MoE: down product with the combine / apart (e0f4134) [t=$((SECONDS - t0))]"
for i in 1 2 3; do
  rrun old down-combine$i qwen3-30b-a3b-4bit
  rrun old down-apart$i qwen3-30b-a3b-4bit MLXCEL_CUDA_FUSE_DOWN=0
done
rlog "== sweep (e0f4134) [t=$((SECONDS - t0))]"
cp .gpu/old/mlxcel .gpu/bin/mlxcel
SWEEP_R=2 COMMIT=e0f4134 rrun sweep
cp /tmp/sweep.md $OUT/sweep.md 2>/dev/null
rlog "[t=$((SECONDS - t0))]"
cat $OUT/report.txt
