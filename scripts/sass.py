#!/usr/bin/env python3
"""SASS of chosen kernels without a GPU: NVRTC (pip nvidia-cuda-nvrtc) compiles common.cuh plus the
named kernel files straight to an sm_90 cubin, cuobjdump (pip nvidia-cuda-cuobjdump, with
nvidia-cuda-nvdisasm) prints the functions asked for, into /tmp/sass/FUNCTION.sass. The tools live in
the venv .ci/run makes (target/ci-nvrtc); add the disassemblers to it once:
    target/ci-nvrtc/bin/pip install "nvidia-cuda-cuobjdump==13.2.*" "nvidia-cuda-nvdisasm==13.2.*"
and run with LD_LIBRARY_PATH=target/ci-nvrtc/lib/python3.11/site-packages/nvidia/cu13/lib.

    sass.py FILE.cu[,FILE.cu] FUNCTION... [--regs]   (--regs: ptxas registers and spills of each)
"""
import ctypes, glob, os, subprocess, sys
os.makedirs("/tmp/sass", exist_ok=True)
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
site = glob.glob(os.path.join(root, "target/ci-nvrtc/lib/python*/site-packages/nvidia/cu13"))[0]
nvrtc = ctypes.CDLL(os.path.join(site, "lib/libnvrtc.so.13"))
files = ["common.cuh"] + sys.argv[1].split(",")
src = "".join(open(os.path.join(root, "crates/cuda/kernels", f)).read() + "\n" for f in files).encode()
prog = ctypes.c_void_p()
assert nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src, b"k.cu", 0, None, None) == 0
opts = [b"--gpu-architecture=sm_90", b"--std=c++17", b"--ptxas-options=-v"]
arr = (ctypes.c_char_p * len(opts))(*opts)
rc = nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
n = ctypes.c_size_t(); nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
log = ctypes.create_string_buffer(n.value); nvrtc.nvrtcGetProgramLog(prog, log)
if rc != 0:
    sys.exit(log.value.decode())
nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(n))
cubin = ctypes.create_string_buffer(n.value); nvrtc.nvrtcGetCUBIN(prog, cubin)
open("/tmp/sass/k.cubin", "wb").write(cubin.raw)
env = dict(os.environ, PATH=os.path.join(site, "bin") + ":" + os.environ["PATH"])
cuobjdump = os.path.join(site, "bin/cuobjdump")
for fn in [a for a in sys.argv[2:] if not a.startswith("--")] if os.path.exists(cuobjdump) else []:
    out = subprocess.run([cuobjdump, "-sass", "-fun", fn, "/tmp/sass/k.cubin"], env=env, capture_output=True, text=True).stdout
    open(f"/tmp/sass/{fn}.sass", "w").write(out)
    print(fn, len(out.splitlines()), "lines ->", f"/tmp/sass/{fn}.sass")
if "--regs" in sys.argv:  # ptxas's report: registers and spills of the functions asked for
    name = None
    for line in log.value.decode().splitlines():
        if "Compiling entry function" in line:
            name = line.split("'")[1]
        elif name in sys.argv[2:] and ("registers" in line or "spill" in line):
            print(name, line.strip())
