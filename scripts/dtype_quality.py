#!/usr/bin/env python3
"""Quality of the activation dtypes on real models: perplexity of a fixed English text under
--dtype f32, bf16 and f16, and a greedy divergence profile (the first generated token where
f16 or bf16 departs from f32, over 20 prompts), written as markdown.

    scripts/dtype_quality.py [--mlxcel BIN] [--device cpu|cuda] [-n TOKENS] [-o OUT.md] MODEL...

MODEL is a model folder or .gguf file whose name matches a tests/fixtures/real/*.json
reference (its `perplexity.text` is the text). Needs only the mlxcel binary.
"""

import argparse
import json
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
DTYPES = ["f32", "bf16", "f16"]
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "To make a cup of tea, first",
    "The three primary colors are",
    "In 1969, the first humans",
    "def fibonacci(n):",
    "The quick brown fox",
    "Water boils at a temperature of",
    "My favourite book is",
    "The best way to learn a new language is",
    "Photosynthesis is the process by which",
    "Here is a list of fruits: apple, banana,",
    "The meeting was postponed because",
    "import numpy as np\n",
    "Dear Sir or Madam, I am writing to",
    "The largest planet in the solar system is",
    "A haiku about winter:",
    "Step 1: Preheat the oven to",
    "The stock market fell sharply today after",
    "Translate to French: Good morning ->",
]


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"dtype_quality: {' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def reference_text(model: pathlib.Path) -> str:
    stem = model.parent.name if model.is_file() else model.name
    ref = ROOT / "tests/fixtures/real" / f"{stem}.json"
    if not ref.exists():
        sys.exit(f"dtype_quality: no reference {ref} for {model}")
    return json.loads(ref.read_text())["perplexity"]["text"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", type=pathlib.Path)
    ap.add_argument("--mlxcel", default=str(ROOT / "target/release/mlxcel"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("-n", type=int, default=32, help="greedy tokens per prompt")
    ap.add_argument("-o", type=pathlib.Path, help="markdown output, rewritten after each model")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS), help="use the first N prompts")
    a = ap.parse_args()
    prompts = PROMPTS[: a.prompts]
    out = [f"device `{a.device}`, {len(prompts)} prompts, {a.n} greedy tokens each (raw prompts, no chat template)\n"]
    for model in a.models:
        text_file = pathlib.Path("/tmp") / f"dtype-quality-{model.stem}.txt"
        text_file.write_text(reference_text(model))
        base = [a.mlxcel, "--device", a.device]
        ppl = {}
        for d in DTYPES:
            t = time.time()
            r = run(base + ["perplexity", "-m", str(model), "--file", str(text_file), "--dtype", d, "--json"])
            ppl[d] = r["ppl"]
            print(f"{model.name} {d}: perplexity {ppl[d]:.4f} ({time.time() - t:.0f} s)", file=sys.stderr)
        tokens = {d: [] for d in DTYPES}
        for i, prompt in enumerate(prompts):
            for d in DTYPES:
                r = run(base + ["generate", "-m", str(model), "-p", prompt, "--no-chat-template",
                                "-n", str(a.n), "--dtype", d, "--json"])
                tokens[d].append(r["tokens"])
            print(f"{model.name}: prompt {i + 1}/{len(prompts)}", file=sys.stderr)
        out.append(f"## {model.name}\n")
        out.append("| dtype | perplexity | vs f32 | vs bf16 |")
        out.append("|---|---|---|---|")
        for d in DTYPES:
            out.append(f"| {d} | {ppl[d]:.4f} | {100 * (ppl[d] / ppl['f32'] - 1):+.3f}% | {100 * (ppl[d] / ppl['bf16'] - 1):+.3f}% |")
        out.append("")
        out.append(f"First differing greedy token (0-based; `=` all {a.n} equal):\n")
        pairs = [("f16", "f32"), ("bf16", "f32"), ("f16", "bf16")]
        out.append("| prompt | " + " | ".join(f"{x} vs {y}" for x, y in pairs) + " |")
        out.append("|---|" + "---|" * len(pairs))
        summary = {p: [] for p in pairs}
        for i, prompt in enumerate(prompts):
            cells = []
            for x, y in pairs:
                tx, ty = tokens[x][i], tokens[y][i]
                first = next((k for k, (u, v) in enumerate(zip(tx, ty)) if u != v), None)
                if first is None and len(tx) != len(ty):
                    first = min(len(tx), len(ty))
                summary[(x, y)].append(first)
                cells.append("=" if first is None else str(first))
            out.append(f"| {json.dumps(prompt)[1:-1][:40]} | " + " | ".join(cells) + " |")
        cells = []
        for p in pairs:
            same = sum(f is None for f in summary[p])
            diverged = sorted(f for f in summary[p] if f is not None)
            med = diverged[len(diverged) // 2] if diverged else "–"
            cells.append(f"{same}/{len(prompts)} equal; median first diff {med}")
        out.append("| **summary** | " + " | ".join(cells) + " |")
        out.append("")
        if a.o:
            a.o.write_text("\n".join(out) + "\n")
    print("\n".join(out))


if __name__ == "__main__":
    main()
