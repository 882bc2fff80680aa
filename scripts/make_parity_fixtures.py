#!/usr/bin/env python3
"""Generate the mlx-lm parity fixtures under tests/fixtures/parity/.

Each case is a tiny random-weight checkpoint built with mlx-lm's own model
classes, converted (dtype cast + quantization) and saved the way
``mlx_lm convert`` does it, plus a ``reference.json`` with next-token NLLs and a
greedy continuation computed by mlx-lm itself on the checkpoint loaded back from
disk, with every floating parameter upcast to float32.

Usage (from anywhere; needs only python3 with venv/pip and PyPI access):

    python3 scripts/make_parity_fixtures.py            # (re)generate all cases
    python3 scripts/make_parity_fixtures.py --check    # regenerate into a temp
                                                       # dir, diff with the repo
    python3 scripts/make_parity_fixtures.py --case llama-bf16 --case qwen3-q4g64

On first use the script creates ``.venv-parity/`` at the repository root,
installs the pinned packages below into it and re-executes itself with the
venv's interpreter. ``--venv PATH`` picks another venv location and
``--no-venv`` runs in the current interpreter (which must already have the
pinned versions).

Everything is seeded: weights come from ``mx.random`` with explicit keys derived
from (case seed, parameter name), prompts from ``mx.random`` as well, so a
rerun with the same package versions writes byte-identical files (``--check``
verifies this).
"""

from __future__ import annotations

import argparse
import copy
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

SCRIPT = Path(__file__).resolve()
REPO = SCRIPT.parent.parent
DEFAULT_VENV = REPO / ".venv-parity"
DEFAULT_OUT = REPO / "tests" / "fixtures" / "parity"
REQUIREMENTS_FILE = SCRIPT.parent / "requirements-parity.txt"

MLX_VERSION = "0.32.4"
MLX_LM_VERSION = "0.32.2"
PINNED_REQUIREMENTS = [
    f"mlx[cpu]=={MLX_VERSION}",
    f"mlx-lm=={MLX_LM_VERSION}",
    "tokenizers==0.23.3",
    "transformers==5.24.0",
]
REEXEC_GUARD = "MLXCEL_PARITY_REEXECUTED"
STAMP_NAME = ".mlxcel-parity-requirements"

FORMAT = "mlxcel-parity-v1"
PROMPT_LEN = 24
GREEDY_STEPS = 16

# Acceptance criteria for a random checkpoint (see generate_case): the
# greedy continuation must not be degenerate and every greedy step must be
# decided by a clear margin, so that an engine that is numerically close to
# mlx-lm (but not bit-identical) reproduces the same tokens.
MIN_DISTINCT_GREEDY = 5
MIN_GREEDY_MARGIN = 0.05
MAX_ATTEMPTS = 64

# Standard deviations of the random weights: RMSNorm weights are 1 + 0.15 * N,
# biases 0.1 * N, embeddings / lm_head 0.15 * N, other linear weights
# LINEAR_STD * N unless a case overrides it.
LINEAR_STD = 0.12


# ---------------------------------------------------------------------------
# Case definitions
# ---------------------------------------------------------------------------

COMMON_SHAPE = dict(
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=256,
    max_position_embeddings=256,
    rope_theta=10000.0,
)

LLAMA3_ROPE_SCALING = {
    # With head_dim 32 and theta 1e4 the RoPE wavelengths are 2*pi*1e4^(2i/32):
    # 6.3, 11.2, 19.9, 35.3, 62.8, ...  original_max_position_embeddings=32
    # puts the low-frequency cut-off at wavelength 32 and the high-frequency one
    # at 8, so dim pair 0 is kept, pairs 1-2 are smoothly interpolated and pairs
    # 3..15 are divided by `factor`: every branch of the llama3 rule is used.
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
    "rope_type": "llama3",
}

# The way mlx_lm.convert's mixed-quant recipes (mixed_quant_predicate_builder)
# describe a per-module override: a dict returned by the quant predicate, which
# quantize_model() records under config["quantization"][<module path>].
DOWN_PROJ_OVERRIDE = {
    "model.layers.1.mlp.down_proj": {"group_size": 32, "bits": 8, "mode": "affine"}
}

CASES = [
    dict(
        name="llama-bf16",
        arch="llama",
        seed=101,
        vocab_size=512,
        tie=False,
        rope_scaling=None,
        quant=None,
        tokenizer=True,
    ),
    dict(
        name="llama-rope3-q4g64",
        arch="llama",
        seed=202,
        vocab_size=384,
        tie=False,
        rope_scaling=LLAMA3_ROPE_SCALING,
        quant=dict(bits=4, group_size=64, overrides=DOWN_PROJ_OVERRIDE),
    ),
    dict(
        name="qwen2-bias-tied-bf16",
        arch="qwen2",
        seed=303,
        vocab_size=448,
        tie=True,
        quant=None,
    ),
    dict(
        # Same architecture, shapes and seed sequence as qwen2-bias-tied-bf16
        # (the accepted candidate can differ; see reference.json's note).
        name="qwen2-bias-tied-q8g32",
        arch="qwen2",
        seed=303,
        vocab_size=448,
        tie=True,
        quant=dict(bits=8, group_size=32),
    ),
    dict(
        name="qwen3-q4g64",
        arch="qwen3",
        seed=404,
        vocab_size=320,
        tie=False,
        head_dim=64,  # != hidden_size / num_attention_heads (= 32)
        quant=dict(bits=4, group_size=64),
    ),
    dict(
        name="qwen3-q4g128-f32norms",
        arch="qwen3",
        seed=505,
        vocab_size=300,
        tie=True,
        head_dim=64,
        quant=dict(bits=4, group_size=128),
        norms_f32=True,
    ),
    dict(
        # 8 experts, top-2, renormalized; layer 1 is a dense MLP (mlp_only_layers).
        # mlx-lm's quant_predicate keeps the router gates (mlp.gate) at 8 bits.
        name="qwen3_moe-q4g64",
        arch="qwen3_moe",
        seed=606,
        vocab_size=352,
        tie=False,
        head_dim=64,
        quant=dict(bits=4, group_size=64),
        moe=dict(
            num_hidden_layers=3,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[1],
        ),
    ),
    dict(
        # 8 experts, top-2, not renormalized, and in every layer a shared expert scaled by
        # sigmoid(shared_expert_gate(x)); q/k/v biases as in Qwen2. mlx-lm's qwen2_moe
        # quantizes its router and shared-expert gate at 4 bits like the rest.
        name="qwen2_moe-q4g64",
        arch="qwen2_moe",
        seed=707,
        vocab_size=352,
        tie=False,
        quant=dict(bits=4, group_size=64),
        moe=dict(
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            shared_expert_intermediate_size=128,
        ),
    ),
    # Gemma: norms are stored as w and used as 1 + w (about 2 here). Tied
    # embeddings times sqrt(hidden) would make every token predict itself at
    # the usual 0.15 std, hence embed_std. mlx-lm's gemma2 has no sliding window
    # (every layer global), so its window is set beyond the 40 positions used;
    # the soft-caps are small enough to bend the logits.
    dict(
        name="gemma2-softcap-bf16",
        arch="gemma2",
        seed=606,
        vocab_size=352,
        tie=True,
        head_dim=32,
        layers=3,
        embed_std=0.05,
        gemma=dict(
            query_pre_attn_scalar=48,
            attn_logit_softcapping=4.0,
            final_logit_softcapping=3.0,
            sliding_window=4096,
        ),
        quant=None,
    ),
    # Gemma 3: 5 layers, every 3rd global (layers 0, 1, 3, 4 slide), a window
    # of 6 keys against a 24-token prompt, linear rope_scaling on the global
    # layers only. The bf16 case also writes the equivalent layer_types.
    dict(
        name="gemma3-text-bf16",
        arch="gemma3_text",
        seed=707,
        vocab_size=416,
        tie=True,
        head_dim=32,
        layers=5,
        embed_std=0.05,
        gemma=dict(
            query_pre_attn_scalar=32,
            sliding_window=6,
            sliding_window_pattern=3,
            rope_local_base_freq=100.0,
            rope_scaling={"factor": 2.0, "rope_type": "linear"},
            layer_types=True,
        ),
        quant=None,
    ),
    dict(
        name="gemma3-text-q4g64",
        arch="gemma3_text",
        seed=808,
        vocab_size=384,
        tie=True,
        head_dim=64,
        layers=5,
        embed_std=0.05,
        gemma=dict(
            query_pre_attn_scalar=48,
            sliding_window=7,
            sliding_window_pattern=3,
            rope_local_base_freq=10000.0,
            rope_scaling=None,
            layer_types=False,
        ),
        quant=dict(bits=4, group_size=64),
    ),
]

# Special tokens of the llama-bf16 tokenizer, appended at the end of the vocab
# like Llama 3 does (ids vocab_size-5 .. vocab_size-1).
SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]
BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|eot_id|>"

# Meta's Llama-3-Instruct chat template (verbatim).
LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

TOKENIZER_CORPUS = """\
The quick brown fox jumps over the lazy dog. A small model can still be a
useful model when the goal is to test the machinery around it: the loader, the
tokenizer, the attention kernels and the sampler all have to agree with each
other before any real weights are loaded.

Once upon a time there was a little town by the sea. Every morning the fishing
boats left the harbour before the sun came up, and every evening they came back
with their nets full of silver fish. The children of the town ran down to the
water to watch them return, and the old sailors told stories about storms,
islands and lights that moved under the waves.

In the garden behind the house the roses were in bloom. My grandmother said that
the secret of a good garden is patience: you plant the seeds, you water them,
and then you wait. She kept a notebook where she wrote the date of the first
flower of every year, and the notebook went back more than forty years.

How are you today? I am fine, thank you. What would you like to do this
afternoon? We could go for a walk in the park, read a book, or cook something
new for dinner. It is going to rain later, so we should take an umbrella.

Numbers and symbols matter too: 1, 2, 3, 10, 42, 100 and 2024; (a + b) * c = d;
e-mail: hello@example.com; the price is $19.99, or about 20 dollars.
"""

TOKENIZER_SAMPLES = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  Leading spaces, tabs\tand\nnewlines.",
    "Zebra quizzes: \u00e9t\u00e9, na\u00efve, \u65e5\u672c\u8a9e, \U0001F600.",
]
CHAT_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Tell me a story about the sea."},
]


# ---------------------------------------------------------------------------
# Environment bootstrap (runs with any python3, before mlx is imported)
# ---------------------------------------------------------------------------


def read_requirements_file() -> list[str]:
    reqs = []
    for line in REQUIREMENTS_FILE.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            reqs.append(line)
    return reqs


def venv_python(venv: Path) -> Path:
    if os.name == "nt":
        return venv / "Scripts" / "python.exe"
    return venv / "bin" / "python"


def running_in(venv: Path) -> bool:
    try:
        return Path(sys.prefix).resolve() == venv.resolve()
    except OSError:
        return False


def bootstrap(venv: Path) -> None:
    """Make sure `venv` holds the pinned packages and re-execute inside it."""
    venv = venv.resolve()
    if running_in(venv):
        return
    if os.environ.get(REEXEC_GUARD):
        raise SystemExit(
            f"re-executed with {sys.executable} but sys.prefix is {sys.prefix}, "
            f"not {venv}; pass --no-venv to use the current interpreter"
        )
    py = venv_python(venv)
    if not py.exists():
        print(f"[parity] creating virtual environment {venv}", flush=True)
        subprocess.check_call([sys.executable, "-m", "venv", str(venv)])
    # Keep the venv out of git without touching .gitignore (Python >= 3.13's
    # venv module writes the same file by itself).
    gitignore = venv / ".gitignore"
    if not gitignore.exists():
        gitignore.write_text("# Created by scripts/make_parity_fixtures.py\n*\n")
    stamp = venv / STAMP_NAME
    wanted = "\n".join(PINNED_REQUIREMENTS) + "\n"
    if not stamp.exists() or stamp.read_text() != wanted:
        print(f"[parity] installing {' '.join(PINNED_REQUIREMENTS)}", flush=True)
        subprocess.check_call(
            [
                str(py),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                *PINNED_REQUIREMENTS,
            ]
        )
        stamp.write_text(wanted)
    argv = [str(py), str(SCRIPT), *sys.argv[1:]]
    env = dict(os.environ, **{REEXEC_GUARD: "1"})
    print(f"[parity] re-executing with {py}", flush=True)
    if os.name == "nt":
        raise SystemExit(subprocess.call(argv, env=env))
    os.execve(str(py), argv, env)


# ---------------------------------------------------------------------------
# Fixture generation (runs inside the venv)
# ---------------------------------------------------------------------------


def check_versions() -> None:
    import mlx.core as mx
    import mlx_lm

    got = (mx.__version__, mlx_lm.__version__)
    if got != (MLX_VERSION, MLX_LM_VERSION):
        raise SystemExit(
            f"need mlx {MLX_VERSION} and mlx-lm {MLX_LM_VERSION}, "
            f"found mlx {got[0]} and mlx-lm {got[1]}"
        )


def hf_config(spec: dict, bos_id: int, eos_id) -> dict:
    """An HF-style config.json (before mlx-lm adds its quantization block)."""
    v = spec["vocab_size"]
    s = COMMON_SHAPE
    base = dict(
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        hidden_act="silu",
        hidden_size=s["hidden_size"],
        initializer_range=0.02,
        intermediate_size=s["intermediate_size"],
        max_position_embeddings=s["max_position_embeddings"],
        model_type=spec["arch"],
        num_attention_heads=s["num_attention_heads"],
        num_hidden_layers=s["num_hidden_layers"],
        num_key_value_heads=s["num_key_value_heads"],
        rope_theta=s["rope_theta"],
        tie_word_embeddings=spec["tie"],
        torch_dtype="bfloat16",
        use_cache=True,
        vocab_size=v,
    )
    arch = spec["arch"]
    if arch == "llama":
        base.update(
            architectures=["LlamaForCausalLM"],
            attention_bias=False,
            attention_dropout=0.0,
            head_dim=s["hidden_size"] // s["num_attention_heads"],
            mlp_bias=False,
            pretraining_tp=1,
            rms_norm_eps=1e-5,
            rope_scaling=copy.deepcopy(spec.get("rope_scaling")),
        )
    elif arch == "qwen2":
        base.update(
            architectures=["Qwen2ForCausalLM"],
            attention_dropout=0.0,
            max_window_layers=s["num_hidden_layers"],
            rms_norm_eps=1e-6,
            rope_scaling=None,
            sliding_window=None,
            use_sliding_window=False,
        )
    elif arch == "qwen3":
        base.update(
            architectures=["Qwen3ForCausalLM"],
            attention_bias=False,
            attention_dropout=0.0,
            head_dim=spec["head_dim"],
            max_window_layers=s["num_hidden_layers"],
            rms_norm_eps=1e-6,
            rope_scaling=None,
            sliding_window=None,
            use_sliding_window=False,
        )
    elif arch == "qwen3_moe":
        base.update(
            architectures=["Qwen3MoeForCausalLM"],
            attention_bias=False,
            attention_dropout=0.0,
            head_dim=spec["head_dim"],
            max_window_layers=spec["moe"]["num_hidden_layers"],
            output_router_logits=False,
            rms_norm_eps=1e-6,
            rope_scaling=None,
            router_aux_loss_coef=0.001,
            sliding_window=None,
            use_sliding_window=False,
            **spec["moe"],
        )
    elif arch == "qwen2_moe":
        base.update(
            architectures=["Qwen2MoeForCausalLM"],
            attention_dropout=0.0,
            decoder_sparse_step=1,
            max_window_layers=s["num_hidden_layers"],
            mlp_only_layers=[],
            norm_topk_prob=False,
            output_router_logits=False,
            rms_norm_eps=1e-6,
            rope_scaling=None,
            router_aux_loss_coef=0.001,
            sliding_window=None,
            use_sliding_window=False,
            **spec["moe"],
        )
    elif arch in ("gemma2", "gemma3_text"):
        g = spec["gemma"]
        layers = spec["layers"]
        base.update(
            architectures=["Gemma2ForCausalLM" if arch == "gemma2" else "Gemma3ForCausalLM"],
            attention_bias=False,
            attention_dropout=0.0,
            head_dim=spec["head_dim"],
            hidden_act="gelu_pytorch_tanh",
            hidden_activation="gelu_pytorch_tanh",
            num_hidden_layers=layers,
            query_pre_attn_scalar=g["query_pre_attn_scalar"],
            rms_norm_eps=1e-6,
            sliding_window=g["sliding_window"],
        )
        if arch == "gemma2":
            base.update(
                attn_logit_softcapping=g["attn_logit_softcapping"],
                final_logit_softcapping=g["final_logit_softcapping"],
            )
        else:
            n = g["sliding_window_pattern"]
            base.update(
                rope_local_base_freq=g["rope_local_base_freq"],
                rope_scaling=copy.deepcopy(g["rope_scaling"]),
                sliding_window_pattern=n,
            )
            if g["layer_types"]:
                base["layer_types"] = [
                    "full_attention" if (i + 1) % n == 0 else "sliding_attention"
                    for i in range(layers)
                ]
    else:
        raise ValueError(arch)
    return dict(sorted(base.items()))


def is_norm_param(name: str) -> bool:
    # input_layernorm, post_attention_layernorm, model.norm, q_norm, k_norm
    return name.endswith("norm.weight")


def init_random_weights(
    model, seed: int, linear_std: float, norm_center: float = 1.0, embed_std: float = 0.15
) -> None:
    """Replace every parameter by seeded random values (float32)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten

    new = []
    for name, p in tree_flatten(model.parameters()):
        key = mx.random.key(zlib.crc32(f"{seed}/{name}".encode()))
        noise = mx.random.normal(p.shape, dtype=mx.float32, key=key)
        if is_norm_param(name):
            value = norm_center + 0.15 * noise
        elif name.endswith(".bias"):
            value = 0.1 * noise
        elif "embed_tokens" in name or "lm_head" in name:
            value = embed_std * noise
        else:
            value = linear_std * noise
        new.append((name, value))
    model.update(tree_unflatten(new))
    mx.eval(model.parameters())


def cast_like_convert(model, norms_f32: bool) -> None:
    """mlx_lm.convert's dtype step: floating params -> bfloat16.

    With norms_f32 the RMSNorm weights are left in float32 (a cast predicate,
    like the models that define `cast_predicate`), giving a mixed-dtype
    checkpoint.
    """
    import mlx.core as mx
    from mlx.utils import tree_map_with_path

    def set_dtype(k, v):
        if not mx.issubdtype(v.dtype, mx.floating):
            return v
        if norms_f32 and is_norm_param(k):
            return v.astype(mx.float32)
        return v.astype(mx.bfloat16)

    model.update(tree_map_with_path(set_dtype, model.parameters()))
    mx.eval(model.parameters())


def train_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers import trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS),
        min_frequency=1,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    paragraphs = [p.replace("\n", " ") for p in TOKENIZER_CORPUS.split("\n\n")]
    tok.train_from_iterator(paragraphs, trainer=trainer)
    if tok.get_vocab_size() != vocab_size - len(SPECIAL_TOKENS):
        raise SystemExit(
            f"BPE training gave {tok.get_vocab_size()} tokens, wanted "
            f"{vocab_size - len(SPECIAL_TOKENS)}: add text to TOKENIZER_CORPUS"
        )
    tok.add_special_tokens(SPECIAL_TOKENS)
    assert tok.get_vocab_size() == vocab_size
    bos_id = tok.token_to_id(BOS_TOKEN)
    # Llama 3 style: BOS prepended by the post-processor.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    return tok


def write_json(path: Path, obj, indent=2) -> None:
    path.write_text(json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")


def write_tokenizer_files(case_dir: Path, tok, eos_ids: list[int]) -> None:
    tok.save(str(case_dir / "tokenizer.json"))
    added = {}
    for t in SPECIAL_TOKENS:
        added[str(tok.token_to_id(t))] = dict(
            content=t,
            lstrip=False,
            normalized=False,
            rstrip=False,
            single_word=False,
            special=True,
        )
    write_json(
        case_dir / "tokenizer_config.json",
        dict(
            add_bos_token=True,
            add_eos_token=False,
            added_tokens_decoder=added,
            bos_token=BOS_TOKEN,
            chat_template=LLAMA3_CHAT_TEMPLATE,
            clean_up_tokenization_spaces=False,
            eos_token=EOS_TOKEN,
            model_input_names=["input_ids", "attention_mask"],
            model_max_length=COMMON_SHAPE["max_position_embeddings"],
            tokenizer_class="PreTrainedTokenizerFast",
        ),
    )
    write_json(
        case_dir / "generation_config.json",
        dict(
            bos_token_id=tok.token_to_id(BOS_TOKEN),
            do_sample=False,
            eos_token_id=eos_ids,
        ),
    )


def make_prompt(seed: int, vocab_size: int) -> list[int]:
    import mlx.core as mx

    key = mx.random.key(zlib.crc32(f"{seed}/prompt".encode()))
    ids = mx.random.randint(0, vocab_size, (PROMPT_LEN,), key=key)
    return [int(i) for i in ids.tolist()]


def write_checkpoint(spec: dict, case_dir: Path, weight_seed: int) -> dict:
    """Build, convert and save one checkpoint; return the saved config."""
    import mlx.core as mx
    from mlx_lm.utils import _get_classes, quantize_model, save_config, save_model

    v = spec["vocab_size"]
    tok = None
    if spec.get("tokenizer"):
        tok = train_tokenizer(v)
        bos_id = tok.token_to_id(BOS_TOKEN)
        eos = [tok.token_to_id("<|end_of_text|>"), tok.token_to_id(EOS_TOKEN)]
    else:
        bos_id, eos = v - 2, v - 1
    config = hf_config(spec, bos_id, eos)

    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    if spec["arch"] == "gemma3_text" and spec["tie"]:
        # mlx-lm's gemma3_text ties by the absence of lm_head (its sanitize).
        model.pop("lm_head")
        model.tie_word_embeddings = True
    init_random_weights(
        model,
        weight_seed,
        spec.get("linear_std", LINEAR_STD),
        spec.get("norm_center", 1.0),
        spec.get("embed_std", 0.15),
    )
    cast_like_convert(model, spec.get("norms_f32", False))

    q = spec.get("quant")
    if q is not None:
        overrides = q.get("overrides") or {}

        def predicate(path, module):
            if path in overrides:
                return dict(overrides[path])
            return True

        model, config = quantize_model(
            model,
            config,
            q["group_size"],
            q["bits"],
            mode="affine",
            quant_predicate=predicate if overrides else None,
        )
        missing = set(overrides) - set(config["quantization"])
        if missing:
            raise SystemExit(f"overrides not applied: {sorted(missing)}")

    case_dir.mkdir(parents=True, exist_ok=True)
    save_model(case_dir, model)
    save_config(copy.deepcopy(config), config_path=case_dir / "config.json")
    if tok is not None:
        write_tokenizer_files(case_dir, tok, eos)
    del model
    mx.clear_cache()
    return json.loads((case_dir / "config.json").read_text())


def load_f32(case_dir: Path):
    """Load with mlx-lm's loader, then upcast floating params to float32."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load_model

    model, _ = load_model(case_dir)
    before = {k: v.dtype for k, v in tree_flatten(model.parameters())}
    # nn.Module.set_dtype's default predicate only casts floating arrays, so
    # the packed uint32 quantized weights are left alone.
    model.set_dtype(mx.float32)
    after = {k: v.dtype for k, v in tree_flatten(model.parameters())}
    for k, dt in before.items():
        if mx.issubdtype(dt, mx.floating):
            assert after[k] == mx.float32, (k, after[k])
        else:
            assert after[k] == dt, (k, dt, after[k])
    mx.eval(model.parameters())
    return model


def greedy(model, prompt: list[int]) -> tuple[list[int], list[float]]:
    """Greedy continuation with the KV cache, plus top1 - top2 logit margins."""
    import mlx.core as mx
    import numpy as np
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache

    p = mx.array(prompt)

    # Mirror mlx_lm.generate.generate_step: prefill prompt[:-1] into
    # the KV cache, then feed the last prompt token, then one token at a time.
    cache = make_prompt_cache(model)
    model(p[None, :-1], cache=cache)
    mx.eval([c.state for c in cache])
    y = p[-1:]
    tokens, margins = [], []
    for _ in range(GREEDY_STEPS):
        step_logits = model(y[None], cache=cache)[0, -1].astype(mx.float32)
        row = np.array(step_logits, dtype=np.float32)
        order = np.argsort(-row, kind="stable")
        top1, top2 = int(order[0]), int(order[1])
        assert top1 == int(mx.argmax(step_logits).item())
        tokens.append(top1)
        margins.append(float(row[top1]) - float(row[top2]))
        y = mx.array([top1])

    # Cross-check against mlx-lm's own generation loop (greedy sampler).
    ref = [
        int(t)
        for t, _ in generate_step(
            p, model, max_tokens=GREEDY_STEPS, sampler=lambda lp: mx.argmax(lp, -1)
        )
    ]
    if ref != tokens:
        raise SystemExit(f"generate_step disagrees: {ref} vs {tokens}")
    return tokens, margins


def compute_reference(model, prompt: list[int]) -> dict:
    import mlx.core as mx
    import numpy as np

    p = mx.array(prompt)

    # NLL: one full forward pass, no cache (causal mask).
    logits = model(p[None])[0].astype(mx.float32)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    targets = mx.array(prompt[1:])
    nll = -mx.take_along_axis(logprobs[:-1], targets[:, None], axis=-1)[:, 0]
    nll = [float(x) for x in np.array(nll, dtype=np.float32)]

    tokens, margins = greedy(model, prompt)
    return dict(nll=nll, greedy_tokens=tokens, greedy_margins=margins)


def acceptable(ref: dict, eos) -> tuple[bool, str]:
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    toks = ref["greedy_tokens"]
    if len(set(toks)) < MIN_DISTINCT_GREEDY:
        return False, f"only {len(set(toks))} distinct greedy tokens"
    if min(ref["greedy_margins"]) < MIN_GREEDY_MARGIN:
        return False, f"min margin {min(ref['greedy_margins']):.4f}"
    if eos_ids & set(toks):
        return False, "greedy continuation hits eos"
    return True, ""


def tokenizer_reference(case_dir: Path, model) -> dict:
    """Encodings, chat rendering and a greedy chat generation (llama-bf16)."""
    from mlx_lm.utils import load

    # mlx_lm.load: eos ids come from config.json, overridden by
    # generation_config.json's eos_token_id list.
    _, tokenizer = load(str(case_dir))
    encode = []
    for text in TOKENIZER_SAMPLES:
        ids = tokenizer.encode(text)
        encode.append(dict(text=text, ids=ids, decoded=tokenizer.decode(ids)))
    rendered = tokenizer.apply_chat_template(
        CHAT_MESSAGES, add_generation_prompt=True, tokenize=False
    )
    chat_ids = tokenizer.apply_chat_template(
        CHAT_MESSAGES, add_generation_prompt=True, return_dict=False
    )
    chat_ids = [int(i) for i in chat_ids]
    gen, margins = greedy(model, chat_ids)
    return {
        "format": "mlxcel-parity-tokenizer-v1",
        "note": (
            "encode: tokenizer.encode(text) with the tokenizer from mlx_lm.load "
            "(transformers AutoTokenizer over tokenizer.json; BOS added by the "
            "post-processor). chat: apply_chat_template(messages, "
            "add_generation_prompt=True); its ids are tokenized without adding "
            "special tokens again (the template writes bos_token itself). "
            "chat.greedy_tokens/greedy_margins: computed like reference.json's "
            "greedy run (float32-upcast model, KV cache, no stop on eos)."
        ),
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_ids": sorted(int(i) for i in tokenizer.eos_token_ids),
        "encode": encode,
        "chat": {
            "messages": CHAT_MESSAGES,
            "add_generation_prompt": True,
            "rendered": rendered,
            "ids": chat_ids,
            "greedy_tokens": gen,
            "greedy_margins": margins,
            "greedy_text": tokenizer.decode(gen),
        },
    }


def generate_case(spec: dict, out_dir: Path) -> dict:
    import mlx.core as mx
    import mlx_lm

    case_dir = out_dir / spec["name"]
    prompt = make_prompt(spec["seed"], spec["vocab_size"])
    assert all(0 <= t < spec["vocab_size"] for t in prompt)

    for attempt in range(MAX_ATTEMPTS):
        weight_seed = spec["seed"] * 1000 + attempt
        if case_dir.exists():
            shutil.rmtree(case_dir)
        config = write_checkpoint(spec, case_dir, weight_seed)
        model = load_f32(case_dir)
        ref = compute_reference(model, prompt)
        ok, why = acceptable(ref, config["eos_token_id"])
        tok_ref = None
        if ok and spec.get("tokenizer"):
            # The chat generation must be just as robust.
            tok_ref = tokenizer_reference(case_dir, model)
            chat = tok_ref["chat"]
            ok, why = acceptable(chat, config["eos_token_id"])
            why = why and f"chat: {why}"
        if ok:
            break
        print(f"[parity] {spec['name']}: weight seed {weight_seed} rejected ({why})")
    else:
        raise SystemExit(f"{spec['name']}: no acceptable checkpoint found")

    q = config.get("quantization")
    how = "bfloat16 weights" if q is None else (
        f"affine {q['bits']}-bit group {q['group_size']} quantization"
    )
    note = (
        f"Random weights (mx.random.normal, seed {weight_seed}; candidates are "
        f"rejected until the greedy run has >= {MIN_DISTINCT_GREEDY} distinct "
        f"tokens, no eos and every margin >= {MIN_GREEDY_MARGIN}), {how}, "
        "saved with mlx_lm.utils.save_model/save_config. Reference: checkpoint "
        "loaded back with mlx_lm.utils.load_model, model.set_dtype(mx.float32) "
        "(floating params only; packed uint32 weights untouched), CPU. nll[i] = "
        "-log_softmax(logits[i])[prompt[i+1]] from one uncached forward pass over "
        "the 24 prompt tokens. greedy: mlx_lm make_prompt_cache, prefill "
        "prompt[:-1], then the last prompt token, then one token per call, as "
        "mlx_lm.generate.generate_step does (checked against generate_step with "
        "an argmax sampler); greedy_margins = top1 - top2 of the float32 logits "
        "of each step. No stop on eos."
    )
    reference = {
        "format": FORMAT,
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm.__version__,
        "case": spec["name"],
        "note": note,
        "prompt_tokens": prompt,
        "nll": ref["nll"],
        "greedy_tokens": ref["greedy_tokens"],
        "greedy_margins": ref["greedy_margins"],
    }
    write_json(case_dir / "reference.json", reference)
    if tok_ref is not None:
        write_json(case_dir / "tokenizer_reference.json", tok_ref)
    del model
    mx.clear_cache()
    verify_case(spec, case_dir)
    return reference


def verify_case(spec: dict, case_dir: Path) -> None:
    """Reload from disk in a fresh model and re-check formats and numbers."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    reference = json.loads((case_dir / "reference.json").read_text())
    config = json.loads((case_dir / "config.json").read_text())
    weights = mx.load(str(case_dir / "model.safetensors"))

    # Tied models must not carry an lm_head.
    assert ("lm_head.weight" in weights) == (not spec["tie"]), sorted(weights)
    q = spec.get("quant")
    if q is None:
        assert "quantization" not in config
        assert not any(k.endswith(".scales") for k in weights)
    else:
        qc = config["quantization"]
        assert qc["bits"] == q["bits"] and qc["group_size"] == q["group_size"]
        assert config["quantization_config"] == qc
        for k, w in weights.items():
            if k.endswith(".scales"):
                base = k[: -len(".scales")]
                packed = weights[base + ".weight"]
                assert packed.dtype == mx.uint32, (k, packed.dtype)
                assert weights[base + ".biases"].dtype == w.dtype == mx.bfloat16
                params = qc.get(base, q)
                per_word = 32 // params["bits"]
                in_dims = packed.shape[-1] * per_word
                assert w.shape[-1] == in_dims // params["group_size"], k
    for k, w in weights.items():
        if is_norm_param(k):
            want = mx.float32 if spec.get("norms_f32") else mx.bfloat16
            assert w.dtype == want, (k, w.dtype)

    model = load_f32(case_dir)
    ref = compute_reference(model, reference["prompt_tokens"])
    for field in ("nll", "greedy_tokens", "greedy_margins"):
        if ref[field] != reference[field]:
            raise SystemExit(f"{spec['name']}: {field} not reproduced on reload")
    assert not any(
        v.dtype in (mx.bfloat16, mx.float16) for _, v in tree_flatten(model.parameters())
    )
    err = numpy_check(case_dir, reference)
    print(f"[parity] {spec['name']}: reload reproduces reference.json exactly; "
          f"numpy re-implementation agrees to {err:.1e}")


def numpy_forward(case_dir: Path, tokens: list[int]):
    """Independent float32 numpy forward pass straight from the files.

    Written from the safetensors/config.json layout, not from mlx-lm's
    modules, as a check that the fixtures mean what the docs above say:
    affine dequantization w = q * scale + bias per group of `group_size`
    consecutive input columns, q packed little-end-first into uint32 words;
    per-module overrides under config["quantization"][<module path>];
    non-traditional (rotate-half) RoPE with inv_freq = 1 / theta^(2i/d) and
    the llama3 rule of mlx_lm.models.rope_utils.Llama3RoPE; GQA; qwen3 q/k
    RMSNorm per head before RoPE; tied embeddings as the output head.
    Gemma 2/3 from transformers' definitions: 1 + w RMSNorms, embeddings
    times sqrt(hidden) (bf16-rounded for Gemma 3), norms after attention and
    around the MLP, GELU-tanh, query_pre_attn_scalar, soft-caps, sliding
    windows by layer with Gemma 3's local RoPE base, linear rope_scaling.
    """
    import math

    import mlx.core as mx
    import numpy as np

    cfg = json.loads((case_dir / "config.json").read_text())
    w = mx.load(str(case_dir / "model.safetensors"))

    def arr(name):
        return np.array(w[name].astype(mx.float32))

    def weight(name):
        if name + ".scales" not in w:
            return arr(name + ".weight")
        qc = cfg["quantization"]
        params = qc.get(name, qc)
        bits, gs = params["bits"], params["group_size"]
        packed = np.array(w[name + ".weight"]).astype(np.uint64)
        q = np.stack(
            [(packed >> (bits * j)) & ((1 << bits) - 1) for j in range(32 // bits)],
            axis=-1,
        ).reshape(*packed.shape[:-1], -1, gs)
        scales, biases = arr(name + ".scales"), arr(name + ".biases")
        deq = q.astype(np.float32) * scales[..., None] + biases[..., None]
        return deq.reshape(*packed.shape[:-1], -1)

    gemma = cfg["model_type"] in ("gemma2", "gemma3_text")

    def rms_norm(x, g):
        eps = cfg["rms_norm_eps"]
        scale = 1.0 + g if gemma else g  # Gemma stores w and scales by 1 + w
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * scale

    n_heads, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg["hidden_size"] // n_heads
    if cfg["model_type"] != "qwen2":  # mlx-lm's qwen2 ignores head_dim
        head_dim = cfg.get("head_dim") or head_dim
    t = len(tokens)

    def rope_tables(theta, rs):
        periods = theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
        pos = np.arange(t, dtype=np.float32)
        kind = rs and (rs.get("type") or rs.get("rope_type"))
        if kind == "llama3":
            f, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
            old = rs["original_max_position_embeddings"]
            wavelen = 2 * math.pi * periods
            scaled = np.where(wavelen > old / lo, periods * f, periods)
            smooth = (old / wavelen - lo) / (hi - lo)
            medium = (wavelen > old / hi) & (wavelen < old / lo)
            periods = np.where(medium, scaled / ((1 - smooth) / f + smooth), scaled)
        elif kind == "linear":
            pos = pos / np.float32(rs["factor"])
        elif rs:
            raise ValueError(rs)
        angles = pos[:, None] / periods[None, :]
        return np.cos(angles), np.sin(angles)

    global_rope = rope_tables(cfg["rope_theta"], cfg.get("rope_scaling"))
    # Gemma 3: sliding layers use rope_local_base_freq and no scaling. Which
    # layers slide: transformers' rules (layer_types, else every
    # sliding_window_pattern-th layer is global; Gemma 2: even layers slide).
    local_rope = global_rope
    n_layers = cfg["num_hidden_layers"]
    sliding = [False] * n_layers
    if cfg["model_type"] == "gemma3_text":
        local_rope = rope_tables(cfg["rope_local_base_freq"], None)
        if "layer_types" in cfg:
            sliding = [lt == "sliding_attention" for lt in cfg["layer_types"]]
        else:
            n = cfg["sliding_window_pattern"]
            sliding = [(i + 1) % n != 0 for i in range(n_layers)]
    elif cfg["model_type"] == "gemma2":
        sliding = [i % 2 == 0 for i in range(n_layers)]

    def rope(x, tables):  # (heads, t, head_dim)
        cos, sin = tables
        x1, x2 = x[..., : head_dim // 2], x[..., head_dim // 2 :]
        return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)

    def bf16_round(v: float) -> float:
        bits = int(np.array(v, dtype=np.float32).view(np.uint32))
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return float(np.array(bits, dtype=np.uint32).view(np.float32))

    def gelu_tanh(x):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))

    embed = weight("model.embed_tokens")
    x = embed[np.array(tokens)]
    if gemma:
        scale = np.float32(cfg["hidden_size"] ** 0.5)
        if cfg["model_type"] == "gemma3_text":
            scale = np.float32(bf16_round(float(scale)))
        x = x * scale
    i_idx = np.arange(t)[:, None]
    j_idx = np.arange(t)[None, :]
    causal = np.where(j_idx <= i_idx, 0.0, -np.inf).astype(np.float32)
    attn_scale = cfg["query_pre_attn_scalar"] ** -0.5 if gemma else head_dim**-0.5
    softcap = cfg.get("attn_logit_softcapping")
    for layer in range(n_layers):
        p = f"model.layers.{layer}."
        h = rms_norm(x, arr(p + "input_layernorm.weight"))

        def proj(name, heads):
            y = h @ weight(p + name).T
            if p + name + ".bias" in w:
                y = y + arr(p + name + ".bias")
            return y.reshape(t, heads, head_dim).transpose(1, 0, 2)

        q = proj("self_attn.q_proj", n_heads)
        k = proj("self_attn.k_proj", n_kv)
        v = proj("self_attn.v_proj", n_kv)
        if p + "self_attn.q_norm.weight" in w:
            q = rms_norm(q, arr(p + "self_attn.q_norm.weight"))
            k = rms_norm(k, arr(p + "self_attn.k_norm.weight"))
        tables = local_rope if sliding[layer] else global_rope
        q, k = rope(q, tables), rope(k, tables)
        k = np.repeat(k, n_heads // n_kv, 0)
        v = np.repeat(v, n_heads // n_kv, 0)
        s = q @ k.transpose(0, 2, 1) * attn_scale
        if softcap:
            s = softcap * np.tanh(s / softcap)
        mask = causal
        if sliding[layer]:
            # query i sees keys i - window + 1 ..= i
            mask = np.where(i_idx - j_idx < cfg["sliding_window"], causal, -np.inf)
        s = s + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = (s @ v).transpose(1, 0, 2).reshape(t, n_heads * head_dim)
        o = o @ weight(p + "self_attn.o_proj").T
        if gemma:
            x = x + rms_norm(o, arr(p + "post_attention_layernorm.weight"))
            h = rms_norm(x, arr(p + "pre_feedforward_layernorm.weight"))
            g = h @ weight(p + "mlp.gate_proj").T
            u = h @ weight(p + "mlp.up_proj").T
            m = (gelu_tanh(g) * u) @ weight(p + "mlp.down_proj").T
            x = x + rms_norm(m, arr(p + "post_feedforward_layernorm.weight"))
            continue
        x = x + o
        h = rms_norm(x, arr(p + "post_attention_layernorm.weight"))
        if p + "mlp.gate.weight" in w:
            x = x + numpy_sparse_moe(cfg, h, lambda n: weight(p + "mlp." + n))
            continue
        g = h @ weight(p + "mlp.gate_proj").T
        u = h @ weight(p + "mlp.up_proj").T
        x = x + (g / (1 + np.exp(-g)) * u) @ weight(p + "mlp.down_proj").T
    x = rms_norm(x, arr("model.norm.weight"))
    head = weight("lm_head") if "lm_head.weight" in w else embed
    logits = x @ head.T
    cap = cfg.get("final_logit_softcapping")
    if cap:
        logits = cap * np.tanh(logits / cap)
    return logits.astype(np.float64)


def numpy_sparse_moe(cfg: dict, h, weight):
    """Qwen3-MoE's sparse block from its definition: softmax router, the k most probable
    experts (ties to the higher index, as MLX's argpartition orders equal values by
    index; to the lower for qwen2_moe, which partitions the negated probabilities),
    optional renormalization, sum of the experts' SwiGLU MLPs by router weight; qwen2_moe
    adds its shared expert's SwiGLU scaled by sigmoid(shared_expert_gate(h))."""
    import numpy as np

    logits = h @ weight("gate").T  # (t, experts)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    k = cfg["num_experts_per_tok"]
    gate, up, down = (weight(f"switch_mlp.{n}_proj") for n in ("gate", "up", "down"))
    out = np.zeros_like(h)
    if cfg["model_type"] == "qwen2_moe":
        g = h @ weight("shared_expert.gate_proj").T
        u = h @ weight("shared_expert.up_proj").T
        shared = (g / (1 + np.exp(-g)) * u) @ weight("shared_expert.down_proj").T
        out += shared / (1 + np.exp(-(h @ weight("shared_expert_gate").T)))
    lower_on_ties = -1 if cfg["model_type"] == "qwen2_moe" else 1
    for t in range(h.shape[0]):
        order = sorted(range(probs.shape[1]), key=lambda e: (probs[t, e], lower_on_ties * e))[-k:]
        scores = probs[t, order]
        if cfg["norm_topk_prob"]:
            scores = scores / scores.sum()
        for e, s in zip(order, scores):
            g, u = gate[e] @ h[t], up[e] @ h[t]
            out[t] += s * (down[e] @ (g / (1 + np.exp(-g)) * u))
    return out


def numpy_check(case_dir: Path, reference: dict, tol: float = 1e-4) -> float:
    """Teacher-force prompt + greedy tokens through numpy_forward."""
    import numpy as np

    prompt, greedy = reference["prompt_tokens"], reference["greedy_tokens"]
    seq = prompt + greedy
    logits = numpy_forward(case_dir, seq)
    m = logits.max(-1, keepdims=True)
    logprobs = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
    nll = np.array([-logprobs[i, seq[i + 1]] for i in range(len(prompt) - 1)])
    steps = logits[len(prompt) - 1 : len(prompt) - 1 + len(greedy)]
    top2 = np.sort(steps, -1)[:, -2:]
    err = max(
        np.abs(nll - np.array(reference["nll"])).max(),
        np.abs(top2[:, 1] - top2[:, 0] - np.array(reference["greedy_margins"])).max(),
    )
    if list(steps.argmax(-1)) != greedy or err > tol:
        raise SystemExit(
            f"{case_dir.name}: numpy re-implementation disagrees (max err {err:.3g})"
        )
    return float(err)


def dir_files(d: Path) -> dict[str, Path]:
    return {str(p.relative_to(d)): p for p in sorted(d.rglob("*")) if p.is_file()}


def summary_row(case_dir: Path, reference: dict) -> str:
    files = dir_files(case_dir)
    size = sum(p.stat().st_size for p in files.values())
    return (
        f"{reference['case']:<24} {len(files):>5} {size / 1024:>9.1f} "
        f"{min(reference['greedy_margins']):>10.4f}  "
        f"{' '.join(str(t) for t in reference['greedy_tokens'])}"
    )


def run(args) -> int:
    import mlx.core as mx

    check_versions()
    mx.set_default_device(mx.cpu)
    mx.random.seed(0)

    selected = [c for c in CASES if not args.case or c["name"] in args.case]
    unknown = set(args.case or []) - {c["name"] for c in CASES}
    if unknown:
        raise SystemExit(f"unknown case(s): {sorted(unknown)}")

    out_dir = Path(args.out).resolve()
    tmp = None
    if args.check:
        tmp = Path(tempfile.mkdtemp(prefix="mlxcel-parity-"))
        gen_dir = tmp
    else:
        gen_dir = out_dir
    gen_dir.mkdir(parents=True, exist_ok=True)

    rows = []
    for spec in selected:
        print(f"[parity] generating {spec['name']}", flush=True)
        reference = generate_case(spec, gen_dir)
        rows.append(summary_row(gen_dir / spec["name"], reference))

    status = 0
    if args.check:
        for spec in selected:
            new, old = dir_files(gen_dir / spec["name"]), dir_files(out_dir / spec["name"])
            bad = sorted(
                name
                for name in set(new) | set(old)
                if name not in new
                or name not in old
                or not filecmp.cmp(new[name], old[name], shallow=False)
            )
            if bad:
                status = 1
                print(f"[parity] {spec['name']}: differs from {out_dir}: {bad}")
            else:
                print(f"[parity] {spec['name']}: identical to committed fixture")
        shutil.rmtree(tmp)

    print()
    print(f"{'case':<24} {'files':>5} {'size KiB':>9} {'min margin':>10}  greedy tokens")
    for row in rows:
        print(row)
    if not args.check:
        total = sum(
            p.stat().st_size
            for c in selected
            for p in dir_files(out_dir / c["name"]).values()
        )
        print(f"{'total':<24} {'':>5} {total / 1024:>9.1f}")
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="fixture root")
    parser.add_argument("--case", action="append", help="only this case (repeatable)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="regenerate into a temporary dir and compare with --out",
    )
    parser.add_argument("--venv", default=str(DEFAULT_VENV), help="venv to use/create")
    parser.add_argument(
        "--no-venv", action="store_true", help="use the current interpreter"
    )
    args = parser.parse_args()

    if REQUIREMENTS_FILE.exists() and read_requirements_file() != PINNED_REQUIREMENTS:
        raise SystemExit(f"{REQUIREMENTS_FILE} disagrees with PINNED_REQUIREMENTS")
    if not args.no_venv:
        bootstrap(Path(args.venv))
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
