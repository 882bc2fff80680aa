#!/usr/bin/env python3
"""Kernel durations of one replayed decode step, from an Nsight Compute CSV log.

    ncu --csv --metrics gpu__time_duration.sum --cache-control none --clock-control none \
        --log-file LOG.csv mlxcel bench ...
    step_kernels.py LOG.csv [--full FILE]

Launches are split into decode steps at each `argmax_final` (the step's last kernel); the last
complete step is summed per kernel name and grid, largest first. Without cache flushes or
serialization beyond ncu's own, the sum is the step's kernel time alone: against the step's
replayed time from `mlxcel bench`, the difference is what launch gaps and dependencies cost.
"""
import csv
import sys
from collections import OrderedDict


def rows(path):
    lines = [l for l in open(path) if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "ns")
        us = v / 1000.0 if unit in ("ns", "nsecond") else v * 1000.0 if unit in ("ms", "msecond") else v
        yield int(r["ID"]), r["Kernel Name"], r.get("Grid Size", ""), r.get("Block Size", ""), us


def main():
    path = sys.argv[1]
    full = sys.argv[sys.argv.index("--full") + 1] if "--full" in sys.argv else None
    launches = sorted(rows(path))
    steps, cur = [], []
    for l in launches:
        cur.append(l)
        if l[1].startswith("argmax_final"):
            steps.append(cur)
            cur = []
    if not steps:
        print(f"no complete step among {len(launches)} launches")
        return
    step = steps[-1]
    fam = OrderedDict()
    for _, name, grid, block, us in step:
        key = f"{name} grid {grid} block {block}"
        n, t = fam.get(key, (0, 0.0))
        fam[key] = (n + 1, t + us)
    total = sum(t for _, t in fam.values())
    print(f"{len(steps)} steps seen; the last: {len(step)} kernels, {total:.1f} us of kernel time")
    print("| kernel (grid, block) | launches | us a step | us a launch | share |")
    print("|---|---:|---:|---:|---:|")
    for key, (n, t) in sorted(fam.items(), key=lambda kv: -kv[1][1]):
        print(f"| {key} | {n} | {t:.1f} | {t / n:.2f} | {100 * t / total:.1f}% |")
    if full:
        with open(full, "w") as f:
            for i, name, grid, block, us in step:
                f.write(f"{i}\t{us:.2f}\t{name}\t{grid}\t{block}\n")


if __name__ == "__main__":
    main()
