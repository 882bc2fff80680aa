#!/usr/bin/env python3
"""Generate tests/fixtures/moe_routing/: routing edge cases of mlx-lm's own sparse MoE blocks.

Each case is one block (mlx_lm.models.qwen3_moe.Qwen3MoeSparseMoeBlock, or qwen2_moe's with
its shared expert) with seeded random weights, quantized like mlx_lm.convert does it
(4-bit group 64; Qwen3-MoE's quant_predicate keeps the router gate at 8 bits), a random input
x (T, D), and what the block gives in float32: y = block(x) and the chosen experts (the
block's own routing expressions, indices sorted per token). Cases:

  all_tied       router weight zero: every probability 1/E, so the choice is the tie rule.
  tie_second     router rows 2 and 5 identical and second to row 0: a tie for the k-th place.
  tie_second_qwen2  the same router in qwen2_moe's block (argpartition(-p)[:k]; shared expert).
  all_experts    top_k = num_experts.
  never_chosen   experts 3 and 6 have a router row far below the others, and NaN scales in
                 their gate_proj: a correct implementation never reads them.
  dense_bf16     unquantized bfloat16 experts (mlx-lm's SwitchLinear, gather_mm).
  dense_per_expert  the same stored under Hugging Face's per-expert names
                 (mlp.experts.{e}.{gate,up,down}_proj.weight), top-3, no renormalization.

Usage: python3 scripts/make_moe_routing_fixture.py --venv /work/venv-parity
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_parity_fixtures as mpf  # noqa: E402

OUT = mpf.REPO / "tests" / "fixtures" / "moe_routing"
HIDDEN, FF, EXPERTS, TOKENS = 64, 64, 8, 6

CASES = [
    dict(name="all_tied", arch="qwen3_moe", top_k=2, norm=True, router="zero"),
    dict(name="tie_second", arch="qwen3_moe", top_k=2, norm=True, router="tie"),
    dict(name="tie_second_qwen2", arch="qwen2_moe", top_k=2, norm=False, router="tie"),
    dict(name="all_experts", arch="qwen3_moe", top_k=EXPERTS, norm=True, router="random"),
    dict(name="never_chosen", arch="qwen3_moe", top_k=2, norm=True, router="never"),
    dict(name="dense_bf16", arch="qwen3_moe", top_k=2, norm=True, router="random", quant=False),
    dict(
        name="dense_per_expert",
        arch="qwen3_moe",
        top_k=3,
        norm=False,
        router="random",
        quant=False,
        per_expert=True,
    ),
]
NEVER = [3, 6]


def normal(shape, tag):
    import mlx.core as mx

    key = mx.random.key(zlib.crc32(tag.encode()))
    return mx.random.normal(shape, dtype=mx.float32, key=key)


def block_config(spec):
    return dict(
        model_type=spec["arch"],
        hidden_size=HIDDEN,
        num_hidden_layers=1,
        intermediate_size=128,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=HIDDEN,
        num_experts=EXPERTS,
        num_experts_per_tok=spec["top_k"],
        decoder_sparse_step=1,
        mlp_only_layers=[],
        moe_intermediate_size=FF,
        shared_expert_intermediate_size=FF,
        rms_norm_eps=1e-6,
        vocab_size=64,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        max_position_embeddings=64,
        norm_topk_prob=spec["norm"],
    )


def router_weight(kind, tag):
    import mlx.core as mx

    if kind == "zero":
        return mx.zeros((EXPERTS, HIDDEN))
    w = 0.12 * normal((EXPERTS, HIDDEN), tag + "/router")
    if kind == "tie":
        # x is positive (see make_case), so ones-rows dominate: row 0 first, rows 2 and 5
        # (identical, so identical logits and probabilities) share the second place.
        w = 0.02 * w
        ones = mx.ones((HIDDEN,))
        w[0] = 0.3 * ones
        w[2] = 0.2 * ones
        w[5] = 0.2 * ones
    if kind == "never":
        for e in NEVER:
            w[e] = -0.5 * mx.ones((HIDDEN,))
    return w


def make_case(spec):
    import mlx.core as mx
    import mlx.nn as nn
    import numpy as np
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.models import qwen2_moe, qwen3_moe
    from mlx_lm.utils import quantize_model

    name = spec["name"]
    config = block_config(spec)
    mod = qwen3_moe if spec["arch"] == "qwen3_moe" else qwen2_moe
    args = mod.ModelArgs.from_dict(config)
    block_class = (
        qwen3_moe.Qwen3MoeSparseMoeBlock
        if spec["arch"] == "qwen3_moe"
        else qwen2_moe.Qwen2MoeSparseMoeBlock
    )

    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = block_class(args)

    model = Wrap()
    new = []
    for pname, p in tree_flatten(model.parameters()):
        new.append((pname, 0.12 * normal(p.shape, f"{name}/{pname}")))
    model.update(tree_unflatten(new))
    model.mlp.gate.weight = router_weight(spec["router"], name)
    # mlx_lm.convert: bfloat16, then quantization (Qwen3-MoE keeps mlp.gate at 8 bits).
    model.set_dtype(mx.bfloat16)
    predicate = None
    if spec["arch"] == "qwen3_moe":
        predicate = lambda path, _: (  # noqa: E731
            {"group_size": 64, "bits": 8} if path.endswith("mlp.gate") else True
        )
    qconfig = {}
    if spec.get("quant", True):
        model, qconfig = quantize_model(
            model, copy.deepcopy(config), 64, 4, quant_predicate=predicate
        )
    if spec["router"] == "never":
        scales = model.mlp.switch_mlp.gate_proj.scales
        for e in NEVER:
            scales[e] = mx.array(float("nan"), dtype=scales.dtype)
        model.mlp.switch_mlp.gate_proj.scales = scales
    stored = dict(tree_flatten(model.parameters()))

    # Reference: float32 compute on the stored (bfloat16 / packed) values.
    model.set_dtype(mx.float32)
    x = 1.0 + 0.5 * normal((TOKENS, HIDDEN), name + "/x")
    if spec["router"] not in ("tie", "never"):
        x = normal((TOKENS, HIDDEN), name + "/x")
    y = model.mlp(x[None])[0]
    gates = mx.softmax(model.mlp.gate(x), axis=-1, precise=True)
    k = spec["top_k"]
    if spec["arch"] == "qwen3_moe":
        inds = mx.argpartition(gates, kth=-k, axis=-1)[..., -k:]
    else:
        inds = mx.argpartition(-gates, kth=k - 1, axis=-1)[..., :k]
    inds = mx.sort(inds, axis=-1).astype(mx.int32)
    mx.eval(y, inds)
    assert np.isfinite(np.array(y)).all(), name
    if spec["router"] == "never":
        assert not set(NEVER) & set(np.array(inds).ravel().tolist())

    tensors = {k: v for k, v in stored.items()}
    if spec.get("per_expert"):
        for n in ("gate_proj", "up_proj", "down_proj"):
            stacked = tensors.pop(f"mlp.switch_mlp.{n}.weight")
            for e in range(EXPERTS):
                tensors[f"mlp.experts.{e}.{n}.weight"] = stacked[e]
    tensors.update(x=x, y=y, ids=inds)
    meta = dict(
        case=name,
        arch=spec["arch"],
        hidden=HIDDEN,
        experts=EXPERTS,
        top_k=k,
        norm_topk_prob=spec["norm"],
        moe_intermediate_size=FF,
        shared_expert_intermediate_size=FF if spec["arch"] == "qwen2_moe" else None,
        quantization=qconfig.get("quantization"),
    )
    return tensors, meta


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", default=str(mpf.DEFAULT_VENV))
    args = parser.parse_args()
    venv = Path(args.venv)
    if not mpf.running_in(venv):
        # The venv make_parity_fixtures.py creates (and pins); run this script inside it.
        py = mpf.venv_python(venv)
        if not py.exists():
            raise SystemExit(f"{py} not found: run make_parity_fixtures.py once to create it")
        os.execv(str(py), [str(py), str(Path(__file__).resolve()), *sys.argv[1:]])
    import mlx.core as mx

    mpf.check_versions()
    mx.set_default_device(mx.cpu)
    OUT.mkdir(parents=True, exist_ok=True)
    metas = []
    for spec in CASES:
        tensors, meta = make_case(spec)
        mx.save_safetensors(str(OUT / f"{spec['name']}.safetensors"), tensors)
        metas.append(meta)
        print(f"[moe-routing] {spec['name']}: ids {mx.array(tensors['ids']).tolist()}")
    mpf.write_json(
        OUT / "cases.json",
        dict(
            format="mlxcel-moe-routing-v1",
            mlx=mx.__version__,
            note=__doc__.split("\n\nUsage")[0],
            cases=metas,
        ),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
