#!/usr/bin/env python3
"""Summarize a server's MLXCEL_STEP_LOG=1 admit lines (serve.txt) by burst: requests whose
arrival at the HTTP side lies within 300 ms of the previous one's form a burst. For each: how
many, over how long they arrived, the longest wait for the engine, and over how many steps the
engine took them."""
import re
import sys

LINE = re.compile(r"admit (\d+) at step (\d+): received at ([\d.]+) ms, taken ([\d.]+) ms later")


def main():
    admits = sorted(
        (float(m[3]), float(m[4]), int(m[2]))
        for m in map(LINE.search, open(sys.argv[1], errors="replace"))
        if m
    )
    bursts = []
    for a in admits:
        if bursts and a[0] - bursts[-1][-1][0] < 300:
            bursts[-1].append(a)
        else:
            bursts.append([a])
    print("| burst | requests | arrival spread ms | longest wait ms | steps that took them |")
    print("|---:|---:|---:|---:|---:|")
    for i, b in enumerate(bursts):
        spread = b[-1][0] - b[0][0]
        print(f"| {i} | {len(b)} | {spread:.1f} | {max(w for _, w, _ in b):.1f} | {len({s for _, _, s in b})} |")


if __name__ == "__main__":
    main()
