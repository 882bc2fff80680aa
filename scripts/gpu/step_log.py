#!/usr/bin/env python3
"""Summarize a server's MLXCEL_STEP_LOG=1 lines (serve.txt): prefill steps by tokens and decode
steps by rows, with counts, mean wall ms and throughput, as a markdown table."""
import re
import sys
from collections import defaultdict

LINE = re.compile(r"step \d+: decode (\d+) rows ([\d.]+) ms, prefill (\d+) rows (\d+) tokens ([\d.]+) ms")


def main():
    decode = defaultdict(list)
    prefill = defaultdict(list)
    for line in open(sys.argv[1], errors="replace"):
        m = LINE.search(line)
        if not m:
            continue
        rows, dms, prows, tokens, pms = int(m[1]), float(m[2]), int(m[3]), int(m[4]), float(m[5])
        if rows:
            decode[rows].append(dms)
        if tokens:
            prefill[(prows, tokens)].append(pms)
    print("| step | count | mean ms | tok/s |")
    print("|---|---:|---:|---:|")
    for (prows, tokens), ms in sorted(prefill.items()):
        mean = sum(ms) / len(ms)
        print(f"| prefill {prows} rows, {tokens} tokens | {len(ms)} | {mean:.2f} | {tokens / mean * 1e3:.0f} |")
    for rows, ms in sorted(decode.items()):
        mean = sum(ms) / len(ms)
        print(f"| decode {rows} rows | {len(ms)} | {mean:.2f} | {rows / mean * 1e3:.0f} |")


if __name__ == "__main__":
    main()
