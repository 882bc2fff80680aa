#!/usr/bin/env bash
# GPU, 2026-12-06 (13), second call: the loads-first dense GEMVs (gemv.cu dsk_*: a row's words
# of every matrix requested before x is staged or read, warps splitting long rows) for one-row
# products, GLUs and the fused q/k/v products of unquantized models. Checks in full (new op
# cases: every split of k, with norms and biases), then qwen2.5-0.5b decode side by side against
# the warp-a-row kernels (MLXCEL_DENSE_SK=0) and with the LM head on them too (=all); the
# per-head attention's fill (MLXCEL_ATT_FILL, default 264 blocks); Nsight's per-kernel step.
source "$(dirname "$0")/common.sh"
unpack_ptx
{
t0=$SECONDS
checks_in_full
echo "== side by side [t=$((SECONDS - t0))]"
for r in 1 2; do
  bench "dsk-$r" qwen2.5-0.5b-bf16
  bench "warp-$r" qwen2.5-0.5b-bf16 MLXCEL_DENSE_SK=0
  bench "dsk-all-$r" qwen2.5-0.5b-bf16 MLXCEL_DENSE_SK=all
done
for f in 132 528 1056; do bench "fill-$f" qwen2.5-0.5b-bf16 MLXCEL_ATT_FILL=$f; done
echo "[t=$((SECONDS - t0))]"
SKIP=1500 COUNT=1500 ncu_step qwen05 qwen2.5-0.5b-bf16
echo "[t=$((SECONDS - t0))]"
tail -3 /tmp/bench.err
} > $OUT/report.txt 2>&1
cat $OUT/report.txt
