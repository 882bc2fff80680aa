#!/usr/bin/env python3
"""Decode speed on the CPU: mlxcel against mlx-lm (mlx[cpu]) on the same random-weight
checkpoint in Qwen2.5-0.5B's shape (bf16), measured side by side in one run.

    python3 scripts/bench_cpu_vs_mlx.py [--tokens 64] [--prompt 32] [--runs 3]

Uses the pinned venv of scripts/make_parity_fixtures.py (.venv-parity), builds mlxcel in
release mode, writes the checkpoint under models/ (git-ignored) and the result table to
docs/benchmark_results/cpu-decode-qwen2.5-0.5b-shape.md.
"""
import argparse, json, os, platform, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-parity"
MODEL = ROOT / "models" / "bench-qwen2.5-0.5b-shape-bf16"
OUT = ROOT / "docs" / "benchmark_results" / "cpu-decode-qwen2.5-0.5b-shape.md"

CONFIG = {
    "model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "intermediate_size": 4864,
    "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "max_position_embeddings": 32768, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}


def in_venv():
    py = VENV / "bin" / "python"
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    if not py.exists():
        subprocess.run([sys.executable, str(ROOT / "scripts" / "make_parity_fixtures.py"), "--check"], check=True)
    os.execv(str(py), [str(py), __file__, *sys.argv[1:]])


def make_checkpoint():
    if (MODEL / "config.json").exists():
        return
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm.models import qwen2
    from mlx_lm.utils import save_config, save_model
    mx.random.seed(0)
    model = qwen2.Model(qwen2.ModelArgs.from_dict(CONFIG))
    model.update(tree_map(lambda p: (mx.random.normal(p.shape) * 0.02).astype(mx.bfloat16), model.parameters()))
    mx.eval(model.parameters())
    MODEL.mkdir(parents=True, exist_ok=True)
    save_model(MODEL, model)
    save_config(dict(CONFIG), config_path=MODEL / "config.json")
    print(f"wrote {MODEL}", file=sys.stderr)


def mlx_lm_tps(prompt, tokens):
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load_model
    model, _ = load_model(MODEL)
    start = None
    n = 0
    for n, (tok, _) in enumerate(generate_step(mx.array(prompt), model, max_tokens=tokens), start=1):
        if n == 1:
            start = time.perf_counter()  # first token ends the prefill
    return (n - 1) / (time.perf_counter() - start)


def mlxcel_tps(binary, prompt, tokens):
    out = subprocess.run(
        [str(binary), "-m", str(MODEL), "--device", "cpu", "generate", "--prompt-tokens", ",".join(map(str, prompt)),
         "-n", str(tokens), "--json"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["decode_tps"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    in_venv()
    subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    binary = ROOT / "target" / "release" / "mlxcel"
    make_checkpoint()
    prompt = [(i * 7919) % 151936 for i in range(1, args.prompt + 1)]
    import mlx.core as mx
    import mlx_lm
    rows = []
    for run in range(args.runs):  # interleaved, so drift in machine load hits both alike
        a = mlxcel_tps(binary, prompt, args.tokens)
        b = mlx_lm_tps(prompt, args.tokens)
        rows.append((a, b))
        print(f"run {run + 1}: mlxcel {a:.2f} tok/s, mlx-lm {b:.2f} tok/s", file=sys.stderr)
    best = lambda i: max(r[i] for r in rows)
    lines = [
        "# CPU decode: mlxcel vs mlx-lm, Qwen2.5-0.5B shape, bf16 random weights",
        "",
        f"Command: `python3 scripts/bench_cpu_vs_mlx.py --tokens {args.tokens} --prompt {args.prompt} --runs {args.runs}`",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}; "
        f"mlx {mx.__version__}, mlx-lm {mlx_lm.__version__}; date {time.strftime('%Y-%m-%d')}.",
        f"Prompt {args.prompt} tokens, {args.tokens} generated, greedy; decode tok/s excludes the prefill.",
        "mlxcel runs its CPU default (f32 activations, bf16 weights widened in kernels); mlx-lm its default (bf16).",
        "",
        "| run | mlxcel tok/s | mlx-lm tok/s | ratio |",
        "|---|---|---|---|",
    ]
    for i, (a, b) in enumerate(rows, 1):
        lines.append(f"| {i} | {a:.2f} | {b:.2f} | {a / b:.2f}× |")
    lines.append(f"| best | {best(0):.2f} | {best(1):.2f} | {best(0) / best(1):.2f}× |")
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
