#!/usr/bin/env python3
"""Kernel time of whole runs (a prefill, say), from an Nsight Compute CSV log.

    ncu --csv --metrics gpu__time_duration.sum --cache-control none --clock-control none \
        --log-file LOG.csv mlxcel bench ... -g 1
    run_kernels.py LOG.csv [--runs N]

Every launch in the log is summed per kernel name (the grid left out, since prefill shapes
vary), largest first; with --runs N the sums are divided by N (the warm-up and measured runs
of `bench -r N-1`). Decode steps in the log show as their own kernels (tc_*, argmax_final).
"""
import sys
from collections import OrderedDict

from step_kernels import rows


def main():
    path = sys.argv[1]
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 1
    fam = OrderedDict()
    for _, name, _grid, _block, us in sorted(rows(path)):
        key = name.split("(")[0][:90]
        n, t = fam.get(key, (0, 0.0))
        fam[key] = (n + 1, t + us)
    total = sum(t for _, t in fam.values())
    print(f"{sum(n for n, _ in fam.values())} launches, {total / 1000:.2f} ms of kernel time; per run (/{runs}):")
    print("| kernel | launches a run | ms a run | us a launch | share |")
    print("|---|---:|---:|---:|---:|")
    for key, (n, t) in sorted(fam.items(), key=lambda kv: -kv[1][1]):
        print(f"| {key} | {n / runs:.0f} | {t / runs / 1000:.3f} | {t / n:.1f} | {100 * t / total:.1f}% |")


if __name__ == "__main__":
    main()
