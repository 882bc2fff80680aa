#!/usr/bin/env python3
"""Does mlx-lm run what `mlxcel synth` writes, and does it compute what mlxcel computes?

For each preset, `mlxcel synth --preset NAME --out target/synth-check/NAME` writes the random
model; the folder is loaded with `mlx_lm.utils.load` (model and tokenizer), upcast with
`model.set_dtype(mx.float32)` (mlxcel's CPU backend computes in f32; bf16 scales and weights
widen exactly), and compared with `mlxcel -m DIR --device cpu`:

- tokenizer: mlx-lm's tokenizer and `mlxcel generate TEXT --json` give the same prompt ids;
- greedy: GREEDY_STEPS argmax tokens from mlx-lm's `generate_step` against
  `mlxcel generate --prompt-tokens ... --json`;
- logits: -log_softmax of mlx-lm's float32 logits at each next token of prompt + greedy
  continuation against `mlxcel perplexity --tokens ... --json`.

    python3 scripts/check_synth_mlx.py [--presets a,b] [--bin target/release/mlxcel] [--venv DIR]

Writes docs/benchmark_results/synth-mlx-lm.md. Exits non-zero when a greedy token or the
tokenization differs or an NLL is off by more than MAX_NLL_DIFF.
"""
import argparse, json, os, platform, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "target" / "synth-check"
OUT = ROOT / "docs" / "benchmark_results" / "synth-mlx-lm.md"
DEFAULT_PRESETS = "tiny-qwen3-4bit,smollm2-135m-4bit,qwen2.5-0.5b-4bit,qwen2.5-0.5b-bf16"
PROMPT = "Random weights, real shapes: the same model in two engines."
GREEDY_STEPS = 16
MAX_NLL_DIFF = 1e-2


def in_venv(venv):
    py = Path(venv) / "bin" / "python"
    if Path(sys.prefix).resolve() == Path(venv).resolve():
        return
    if not py.exists():
        sys.exit(f"no python in {venv}: pass --venv DIR of a venv with mlx and mlx-lm")
    os.execv(str(py), [str(py), __file__, *sys.argv[1:]])


def run(cmd):
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed:\n{out.stderr}")
    return out.stdout


def mlxcel_json(binary, folder, *args):
    return json.loads(run([binary, "-m", folder, "--device", "cpu", *args]))


def mlx_nll(model, tokens):
    """-log_softmax (float64) of mlx-lm's float32 logits of one forward pass."""
    import mlx.core as mx
    import numpy as np
    logits = np.array(model(mx.array([tokens]))[0].astype(mx.float32)).astype(np.float64)
    logits -= logits.max(axis=-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    return [float(-logp[i, tokens[i + 1]]) for i in range(len(tokens) - 1)]


def mlx_greedy(model, prompt, steps):
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    argmax = lambda logprobs: mx.argmax(logprobs, axis=-1)
    return [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=steps, sampler=argmax)]


def check(binary, preset):
    import mlx.core as mx
    from mlx_lm.utils import load
    folder = WORK / preset
    start = time.perf_counter()
    run([binary, "synth", "--preset", preset, "--out", folder, "--force"])
    synth_s = time.perf_counter() - start
    model, tok = load(str(folder))
    model.set_dtype(mx.float32)
    prompt = tok.encode(PROMPT)
    ours_prompt = mlxcel_json(binary, folder, "generate", PROMPT, "-n", "1", "--json")["prompt_tokens"]
    greedy = mlx_greedy(model, prompt, GREEDY_STEPS)
    ours = mlxcel_json(binary, folder, "generate", "--prompt-tokens", ",".join(map(str, prompt)),
                       "-n", str(GREEDY_STEPS), "--json")["tokens"]
    same = next((i for i, (a, b) in enumerate(zip(greedy, ours)) if a != b), min(len(greedy), len(ours)))
    seq = prompt + greedy
    nll = mlx_nll(model, seq)
    ours_nll = mlxcel_json(binary, folder, "perplexity", "--tokens", ",".join(map(str, seq)), "--json")["nll"]
    size = sum(f.stat().st_size for f in folder.glob("model*.safetensors"))
    return {
        "preset": preset,
        "tokens_ok": prompt == ours_prompt,
        "greedy_same": same,
        "greedy_len": len(greedy),
        "nll_max_diff": max(abs(a - b) for a, b in zip(nll, ours_nll)),
        "nll_len": len(nll),
        "mean_nll": sum(nll) / len(nll),
        "size_mb": size / 1e6,
        "synth_s": synth_s,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default=DEFAULT_PRESETS)
    ap.add_argument("--bin", default=None, help="mlxcel binary (default: target/release/mlxcel, built if missing)")
    ap.add_argument("--venv", default="/work/venv-parity")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    in_venv(args.venv)
    binary = Path(args.bin) if args.bin else ROOT / "target" / "release" / "mlxcel"
    if not binary.exists():
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    import mlx.core as mx
    import mlx_lm
    rows = []
    for preset in args.presets.split(","):
        r = check(binary, preset)
        print(f"{preset}: {r}", file=sys.stderr)
        rows.append(r)
    passed = all(r["tokens_ok"] and r["greedy_same"] == r["greedy_len"] and r["nll_max_diff"] <= MAX_NLL_DIFF
                 for r in rows)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    lines = [
        "# `mlxcel synth` folders in mlx-lm",
        "",
        f"Command: `python3 scripts/check_synth_mlx.py --presets {args.presets}` (commit {commit}, "
        f"mlx {mx.__version__}, mlx-lm {mlx_lm.__version__}, {platform.machine()} CPU).",
        "",
        "Each preset's random weights (seed 0) are written by `mlxcel synth`, loaded with "
        "`mlx_lm.utils.load` and upcast to float32, and compared with mlxcel on the CPU (f32): "
        f"the prompt {PROMPT!r} tokenized by both, {GREEDY_STEPS} greedy tokens, and the NLL of "
        "every next token of prompt + continuation (mlx-lm's log-softmax against "
        "`mlxcel perplexity`).",
        "",
        "| preset | weights MB | tokenizer agrees | greedy tokens equal | max abs NLL diff | mean NLL (mlx-lm) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['preset']} | {r['size_mb']:.1f} | {'yes' if r['tokens_ok'] else 'NO'} | "
                     f"{r['greedy_same']}/{r['greedy_len']} | {r['nll_max_diff']:.2e} (over {r['nll_len']}) | "
                     f"{r['mean_nll']:.3f} |")
    lines += ["", f"Result: {'PASS' if passed else 'FAIL'} (NLL tolerance {MAX_NLL_DIFF}).", ""]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
