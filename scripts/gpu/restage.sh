#!/usr/bin/env bash
# Here, before a device call: ../shared/gpu/stage, .gpu/tests pruned to gpu-test and
# parity_cuda-test (a call carries 64 MiB), the kernels' PTX cache written into .gpu/extra by
# NVRTC and a cubin of it by ptxas (both from the venv .ci/run makes, target/ci-nvrtc), both
# gzipped: common.sh's unpack_ptx puts them in the GPU machine's cache, so neither NVRTC nor the
# driver compiles the kernels there. About 6 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
nv=$PWD/$(dirname "$(dirname "$(find target/ci-nvrtc -path '*nvidia/cu13/bin/ptxas' | head -1)")")
../shared/gpu/stage > /tmp/stage.log 2>&1 || { tail -20 /tmp/stage.log; exit 1; }
find .gpu/tests -type f ! -name gpu-test ! -name parity_cuda-test -delete
rm -f .gpu/extra/ptx-*
LD_LIBRARY_PATH=$nv/lib MLXCEL_CACHE_DIR=$PWD/.gpu/extra \
  cargo test --release --features cuda -p mlxcel-cuda --test gpu write_kernel_cache -- --ignored > /tmp/ptx.log 2>&1
ptx=$(ls .gpu/extra/ptx-*.ptx)
"$nv/bin/ptxas" -arch=sm_90 -o "${ptx%.ptx}.cubin" "$ptx"
gzip -9 .gpu/extra/ptx-*
ls -l .gpu/extra
du -sh .gpu
