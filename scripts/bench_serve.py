#!/usr/bin/env python3
"""Throughput of a running `mlxcel serve` (standard library only).

For each concurrency level, N clients stream /v1/completions at once (each connects, then all
send their requests together), each with a prompt of
--prompt random token ids and --max-tokens output tokens (ignore_eos, greedy). Reports
aggregate output tok/s (all tokens / wall time) and per-stream decode tok/s (tokens after the
first / time from first to last token), min and median. `--temperature T` (with `--top-p`)
samples instead of greedy decoding, as most clients ask. Each level first runs `--warmup`
times unmeasured (default 1), so the server has planned the step shapes that level makes and
a level's figure does not depend on which levels ran before it.

    mlxcel serve -m models/llama-3.1-8b-4bit --port 8080 &
    python3 scripts/bench_serve.py --url http://127.0.0.1:8080 --concurrency 1,8,32,64
"""
import argparse
import http.client
import json
import random
import statistics
import threading
import time
import urllib.parse


def one_stream(url, body, api_key, out, barrier):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    payload = json.dumps(body)
    # Connected and ready, every client sends at once: otherwise the first streams' token
    # parsing (one interpreter lock for all threads) delays the later requests' sending, and
    # the server sees them trickle in over a second.
    try:
        conn.connect()
    except OSError as e:
        out.append({"error": f"connect: {e}"})
        barrier.abort()  # the others stop waiting for this one
        return
    try:
        barrier.wait(timeout=60)
    except threading.BrokenBarrierError:
        out.append({"error": "another client could not connect"})
        return
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", payload, headers)
    resp = conn.getresponse()
    if resp.status != 200:
        out.append({"error": f"{resp.status} {resp.read()[:200]!r}"})
        return
    first = last = None
    tokens = 0
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        elif chunk["choices"] and chunk["choices"][0].get("text"):
            last = time.perf_counter()
            first = first or last
    out.append({"tokens": tokens, "start": start, "first": first, "last": last})


def run(url, n, args, seed=0):
    rng = random.Random(n + 1000 * seed)
    results, threads = [], []
    barrier = threading.Barrier(n)
    for _ in range(n):
        body = {
            "prompt": [rng.randrange(args.vocab) for _ in range(args.prompt)],
            "max_tokens": args.max_tokens,
            "temperature": args.temperature,
            "top_p": args.top_p,
            "seed": rng.randrange(1 << 30),
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        threads.append(threading.Thread(target=one_stream, args=(url, body, args.api_key, results, barrier)))
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise SystemExit(f"concurrency {n}: {len(errors)} failed, e.g. {errors[0]}")
    total = sum(r["tokens"] for r in results)
    per = [
        (r["tokens"] - 1) / (r["last"] - r["first"])
        for r in results
        if r["first"] is not None and r["last"] > r["first"]
    ]
    ttft = [r["first"] - r["start"] for r in results if r["first"] is not None]
    return {
        "concurrency": n,
        "output_tokens": total,
        "wall_s": wall,
        "aggregate_tok_s": total / wall,
        "per_stream_min_tok_s": min(per) if per else 0.0,
        "per_stream_median_tok_s": statistics.median(per) if per else 0.0,
        "ttft_median_s": statistics.median(ttft) if ttft else 0.0,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--api-key")
    p.add_argument("--concurrency", default="1,8,32,64")
    p.add_argument("--prompt", type=int, default=256, help="prompt tokens per request")
    p.add_argument("--max-tokens", type=int, default=256, help="output tokens per request")
    p.add_argument("--vocab", type=int, default=1000, help="prompt ids are drawn below this")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--warmup", type=int, default=1, help="unmeasured runs of each level first")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rows = []
    for n in args.concurrency.split(","):
        for w in range(args.warmup):
            run(args.url, int(n), args, seed=w + 1)
        rows.append(run(args.url, int(n), args))
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    how = "greedy" if args.temperature == 0 else f"temperature {args.temperature}, top_p {args.top_p}"
    print(f"prompt {args.prompt} tokens, output {args.max_tokens} tokens per request, {how}")
    print("| concurrency | aggregate tok/s | per-stream min tok/s | per-stream median tok/s | median TTFT s |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['concurrency']} | {r['aggregate_tok_s']:.1f} | {r['per_stream_min_tok_s']:.1f} "
            f"| {r['per_stream_median_tok_s']:.1f} | {r['ttft_median_s']:.2f} |"
        )


if __name__ == "__main__":
    main()
