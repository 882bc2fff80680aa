#!/usr/bin/env python3
"""Where a replayed decode step's time goes as the kernels really ran, from Nsight Systems.

    nsys profile --trace=cuda --cuda-graph-trace=node -o REP mlxcel bench ...
    nsys stats --report cuda_gpu_trace --format csv --output OUT REP.nsys-rep
    timeline.py OUT_cuda_gpu_trace.csv [--steps N]

Unlike step_kernels.py (Nsight Compute: each kernel alone), the kernels here overlap as the
graph ran them (a programmatic launch starts while the kernel ahead drains). Kernels split into
decode steps at each `argmax_final` (a step's last); of the last N complete steps (default 10),
each kernel family (name and grid) gets its mean duration and its exposed time: how much it
moved the step's running end (its end past every earlier kernel's end), so the exposed times
and the idle gaps add up to the step's time from its first kernel's start to its last's end.
"""
import csv
import sys
from collections import OrderedDict


def kernels(path):
    """(start ns, end ns, family) of each kernel row, in start order (copies and sets skipped)."""
    lines = open(path).read().splitlines()
    first = next(i for i, l in enumerate(lines) if "Start" in l and "Duration" in l)
    out = []
    for r in csv.DictReader(lines[first:]):
        col = lambda word: next((v for k, v in r.items() if k and word in k), None)
        name = col("Name") or ""
        if not name or name.startswith("[CUDA"):
            continue
        start, dur = float(col("Start").replace(",", "")), float(col("Duration").replace(",", ""))
        grid = "x".join(r.get(k, "").strip() for k in ("GrdX", "GrdY", "GrdZ") if r.get(k))
        block = r.get("BlkX", "").strip()
        out.append((start, start + dur, f"{name.split('(')[0]} grid {grid} block {block}"))
    return sorted(out)


def main():
    path = sys.argv[1]
    n = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 10
    steps, cur = [], []
    for k in kernels(path):
        cur.append(k)
        if k[2].startswith("argmax_final"):
            steps.append(cur)
            cur = []
    steps = steps[1:][-n:]  # the first may have begun before the trace
    if not steps:
        print("no complete decode step in the trace")
        return
    fam = OrderedDict()
    wall = idle = 0.0
    for step in steps:
        t0, reach = step[0][0], step[0][0]
        for start, end, name in step:
            f = fam.setdefault(name, [0, 0.0, 0.0])
            f[0] += 1
            f[1] += end - start
            idle += max(0.0, start - reach)
            f[2] += max(0.0, end - max(reach, start))
            reach = max(reach, end)
        wall += reach - t0
    ns = len(steps)
    ends = [max(k[1] for k in step) for step in steps]
    between = [steps[i + 1][0][0] - ends[i] for i in range(ns - 1)]
    print(f"{ns} steps: {wall / ns / 1000:.1f} us a step from first start to last end, "
          f"{idle / ns / 1000:.1f} us of it with no kernel running; "
          f"{sum(between) / max(1, len(between)) / 1000:.1f} us from a step's end to the next's start")
    print("| kernel (grid, block) | launches a step | us a launch | exposed us a step | share of step |")
    print("|---|---:|---:|---:|---:|")
    for name, (count, dur, exposed) in sorted(fam.items(), key=lambda kv: -kv[1][2]):
        print(f"| {name} | {count / ns:g} | {dur / count / 1000:.2f} | {exposed / ns / 1000:.1f} "
              f"| {100 * exposed / wall:.1f}% |")


main()
