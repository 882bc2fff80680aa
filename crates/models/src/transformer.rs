//! The pre-norm decoder every supported architecture is a configuration of: token embedding,
//! `layers × (RMSNorm → attention → residual, RMSNorm → gated MLP → residual)`, final norm,
//! output head. Architectures differ in a `DecoderSpec` and in which tensors exist; Gemma's
//! deltas (sandwich norms, `1 + w` norms, GELU, soft-capping, sliding windows) are
//! `DecoderOptions`.

use anyhow::Result;
use mlxcel_core::dtype::{promote, Promotion};
use mlxcel_core::{DType, GraphBuilder, NodeId, UnaryOp};

use crate::layers::{Embedding, Linear, Loader, RmsNorm, Rope};
use crate::moe::{MoeSpec, SparseMoe};

mod paged;
pub use paged::PagedStep;

/// Shape and options of a decoder, from an architecture's config.
#[derive(Clone, Debug)]
pub struct DecoderSpec {
    pub model_type: String,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub vocab: usize,
    pub rms_eps: f32,
    pub rope: Rope,
    pub max_position: usize,
    pub tie_embeddings: bool,
    /// Biases on q/k/v projections (Qwen2; Llama's `attention_bias`).
    pub qkv_bias: bool,
    /// Bias on the output projection (Llama's `attention_bias`).
    pub o_bias: bool,
    pub mlp_bias: bool,
    /// RMSNorm on each head of q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    /// Routed experts in place of the MLP on the layers it selects (Qwen2/3-MoE).
    pub moe: Option<MoeSpec>,
    /// Why f16 activations are unsafe for this model (`--dtype auto` then avoids f16).
    pub f16_fragile: Option<&'static str>,
    /// What differs from the Llama decoder (Gemma); `Default` is Llama.
    pub options: DecoderOptions,
}

/// The gate activation of the MLP: `down(act(gate(x)) · up(x))`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Activation {
    #[default]
    Silu,
    GeluTanh,
}

/// Decoder options beyond Llama's, all off by default (Gemma 2/3 turn them on).
#[derive(Clone, Debug, Default)]
pub struct DecoderOptions {
    /// Before `model.` and `lm_head` in tensor names (`language_model.` in Gemma 3 multimodal
    /// checkpoints).
    pub weight_prefix: String,
    /// Every RMSNorm scales by `1 + w`.
    pub norm_unit_offset: bool,
    /// Embeddings are multiplied by this, first rounded to the activation dtype.
    pub embed_scale: Option<f32>,
    /// `post_attention_layernorm` normalizes the attention output before the residual add,
    /// and `pre_feedforward_layernorm` / `post_feedforward_layernorm` wrap the MLP likewise.
    pub sandwich_norms: bool,
    pub activation: Activation,
    /// Attention logit scale in place of `1/√head_dim`.
    pub attn_scale: Option<f32>,
    /// `cap · tanh(s / cap)` on attention logits.
    pub attn_softcap: Option<f32>,
    /// `cap · tanh(z / cap)` on output logits.
    pub final_softcap: Option<f32>,
    /// Sliding window per layer (`None`: global); empty means every layer is global.
    pub windows: Vec<Option<usize>>,
    /// RoPE of the sliding-window layers when it differs from `rope`.
    pub local_rope: Option<Rope>,
}

impl DecoderSpec {
    /// The attention logit scale: `query_pre_attn_scalar`'s, else `1/√head_dim`.
    pub fn attention_scale(&self) -> f32 {
        self.options.attn_scale.unwrap_or(1.0 / (self.head_dim as f32).sqrt())
    }

    /// Layer `i`'s sliding window, if it has one.
    pub fn window(&self, i: usize) -> Option<usize> {
        self.options.windows.get(i).copied().flatten()
    }
}

/// One decode/prefill step's runtime inputs, made by the engine.
pub struct StepInputs {
    /// `i32 [1, T]`
    pub tokens: NodeId,
    /// `i32 [T]`
    pub positions: NodeId,
    /// `i32 []`: where this step's keys and values go in the cache.
    pub offset: NodeId,
    /// `i32 []`: valid cache entries after the write (offset + T).
    pub kv_len: NodeId,
    pub tokens_len: usize,
    pub capacity: usize,
    /// Activations and cache dtype.
    pub dtype: DType,
    /// Compute logits for the last position only (generation) or for all (perplexity).
    pub last_only: bool,
}

struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
}

pub(crate) struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
    activation: Activation,
}

/// A layer's feed-forward block: the gated MLP, or routed experts (one per layer, so the
/// variants' sizes do not matter).
#[allow(clippy::large_enum_variant)]
enum Ffn {
    Dense(Mlp),
    Sparse(SparseMoe),
}

struct DecoderLayer {
    input_norm: RmsNorm,
    attn: Attention,
    post_attn_norm: RmsNorm,
    /// With sandwich norms: `pre_feedforward_layernorm`, `post_feedforward_layernorm`.
    ffn_norms: Option<(RmsNorm, RmsNorm)>,
    mlp: Ffn,
}

pub struct Transformer {
    pub spec: DecoderSpec,
    embed: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
}

impl Transformer {
    /// Loads the standard `model.*` / `lm_head` tensor names.
    pub fn load(spec: DecoderSpec, w: &Loader) -> Result<Transformer> {
        let (d, hd) = (spec.hidden, spec.head_dim);
        let pre = &spec.options.weight_prefix;
        let norm = |name: &str, dim: usize| -> Result<RmsNorm> {
            Ok(w.rms_norm(name, dim, spec.rms_eps)?
                .unit_offset(spec.options.norm_unit_offset))
        };
        let mut layers = Vec::with_capacity(spec.layers);
        for i in 0..spec.layers {
            let p = format!("{pre}model.layers.{i}");
            let a = format!("{p}.self_attn");
            let qk_norm = |n: &str| -> Result<Option<RmsNorm>> {
                Ok(if spec.qk_norm {
                    Some(norm(&format!("{a}.{n}"), hd)?)
                } else {
                    None
                })
            };
            let attn = Attention {
                q: w.linear(&format!("{a}.q_proj"), d, spec.heads * hd, spec.qkv_bias)?,
                k: w.linear(&format!("{a}.k_proj"), d, spec.kv_heads * hd, spec.qkv_bias)?,
                v: w.linear(&format!("{a}.v_proj"), d, spec.kv_heads * hd, spec.qkv_bias)?,
                o: w.linear(&format!("{a}.o_proj"), spec.heads * hd, d, spec.o_bias)?,
                q_norm: qk_norm("q_norm")?,
                k_norm: qk_norm("k_norm")?,
            };
            let m = format!("{p}.mlp");
            let mlp = match &spec.moe {
                Some(moe) if moe.is_sparse(i) => Ffn::Sparse(SparseMoe::load(w, &m, d, moe)?),
                _ => Ffn::Dense(Mlp::load(
                    w,
                    &m,
                    d,
                    spec.intermediate,
                    spec.mlp_bias,
                    spec.options.activation,
                )?),
            };
            let ffn_norms = if spec.options.sandwich_norms {
                Some((
                    norm(&format!("{p}.pre_feedforward_layernorm"), d)?,
                    norm(&format!("{p}.post_feedforward_layernorm"), d)?,
                ))
            } else {
                None
            };
            layers.push(DecoderLayer {
                input_norm: norm(&format!("{p}.input_layernorm"), d)?,
                attn,
                post_attn_norm: norm(&format!("{p}.post_attention_layernorm"), d)?,
                ffn_norms,
                mlp,
            });
        }
        // Tied models may still carry an lm_head (some converters write it); use it if present.
        let head = format!("{pre}lm_head");
        let lm_head = if !spec.tie_embeddings || w.checkpoint.contains(&format!("{head}.weight")) {
            Some(w.linear(&head, d, spec.vocab, false)?)
        } else {
            None
        };
        Ok(Transformer {
            embed: w.embedding(&format!("{pre}model.embed_tokens"), spec.vocab, d)?,
            layers,
            norm: norm(&format!("{pre}model.norm"), d)?,
            lm_head,
            spec,
        })
    }

    /// The activation dtype of MLX semantics (`--dtype native`): what the embedding gives.
    pub fn stored_dtype(&self) -> DType {
        self.embed.dtype()
    }

    /// Logits `[1, T', vocab]` (T' = 1 with `last_only`), writing this step's keys and values
    /// into the `layers.{i}.{k,v}_cache` states.
    pub fn forward(&self, b: &mut GraphBuilder, s: &StepInputs) -> Result<NodeId> {
        let last = s.last_only.then_some(s.tokens_len);
        self.decode(b, s.tokens, s.dtype, last, |b, i, attn, h| {
            attn.forward(b, &self.spec, i, h, s)
        })
    }

    /// Embedding → layers (attention by `attend(b, layer, attn, x)`) → norm → head; with
    /// `last_of = Some(T)` only position `T - 1` of each row reaches the head.
    fn decode(
        &self,
        b: &mut GraphBuilder,
        tokens: NodeId,
        dtype: DType,
        last_of: Option<usize>,
        attend: impl Fn(&mut GraphBuilder, usize, &Attention, NodeId) -> Result<NodeId>,
    ) -> Result<NodeId> {
        let mut x = self.embed.lookup(b, tokens, dtype)?;
        if let Some(scale) = self.spec.options.embed_scale {
            x = b.mul_scalar(x, scale)?;
        }
        for (i, layer) in self.layers.iter().enumerate() {
            b.set_layer(Some(i as u32));
            x = layer.forward(b, x, |b, h| attend(b, i, &layer.attn, h))?;
            b.name(x, "residual");
        }
        b.set_layer(None);
        if let Some(t) = last_of.filter(|&t| t > 1) {
            x = b.slice_axis(x, 1, t - 1, t)?;
        }
        let h = self.norm.forward(b, x)?;
        let logits = match &self.lm_head {
            Some(head) => head.forward(b, h)?,
            None => self.embed.as_linear(b, h)?,
        };
        let logits = match self.spec.options.final_softcap {
            Some(cap) => b.unary(UnaryOp::Softcap(cap), logits)?,
            None => logits,
        };
        Ok(b.name(logits, "logits"))
    }
}

impl DecoderLayer {
    fn forward(
        &self,
        b: &mut GraphBuilder,
        x: NodeId,
        attend: impl FnOnce(&mut GraphBuilder, NodeId) -> Result<NodeId>,
    ) -> Result<NodeId> {
        let h = self.input_norm.forward(b, x)?;
        let h = b.name(h, "attn_norm");
        let a = attend(b, h)?;
        let a = b.name(a, "attn_out");
        let Some((pre_ffn, post_ffn)) = &self.ffn_norms else {
            let x = b.add(x, a)?;
            let h = self.post_attn_norm.forward(b, x)?;
            let h = b.name(h, "ffn_norm");
            let m = self.mlp.forward(b, h)?;
            let m = b.name(m, "ffn_out");
            return Ok(b.add(x, m)?);
        };
        // Sandwich norms (Gemma): each sublayer's output is normalized before the residual add.
        let a = self.post_attn_norm.forward(b, a)?;
        let x = b.add(x, a)?;
        let h = pre_ffn.forward(b, x)?;
        let h = b.name(h, "ffn_norm");
        let m = self.mlp.forward(b, h)?;
        let m = post_ffn.forward(b, m)?;
        let m = b.name(m, "ffn_out");
        Ok(b.add(x, m)?)
    }
}

impl Attention {
    /// `x [B, T, hidden]` → q `[B, Hq, T, hd]`, k and v `[B, Hkv, T, hd]`, RoPE at `positions`.
    fn qkv(
        &self,
        b: &mut GraphBuilder,
        spec: &DecoderSpec,
        i: usize,
        x: NodeId,
        positions: NodeId,
    ) -> Result<[NodeId; 3]> {
        let (batch, t, hd) = (b.shape(x)[0], b.shape(x)[1], spec.head_dim);
        // The three products first, side by side, then their biases (a backend may run all of
        // them as one launch, which nothing may read before its last node), then per
        // projection: [B, T, H·hd] → [B, T, H, hd] (→ per-head norm) → [B, H, T, hd].
        let products = [self.q.product(b, x)?, self.k.product(b, x)?, self.v.product(b, x)?];
        let biased = [
            self.q.add_bias(b, products[0])?,
            self.k.add_bias(b, products[1])?,
            self.v.add_bias(b, products[2])?,
        ];
        let mut biased = biased.into_iter();
        let mut heads = |b: &mut GraphBuilder, n: usize, norm: &Option<RmsNorm>| -> Result<NodeId> {
            let y = biased.next().expect("three projections");
            let mut y = b.reshape(y, &[batch, t, n, hd])?;
            if let Some(norm) = norm {
                y = norm.forward(b, y)?;
            }
            Ok(b.swap_axes(y, 1, 2)?)
        };
        let q = heads(b, spec.heads, &self.q_norm)?;
        let k = heads(b, spec.kv_heads, &self.k_norm)?;
        let v = heads(b, spec.kv_heads, &None)?;
        let rope = match (spec.window(i), &spec.options.local_rope) {
            (Some(_), Some(local)) => local,
            _ => &spec.rope,
        };
        let q = rope.forward(b, q, positions)?;
        let k = rope.forward(b, k, positions)?;
        Ok([q, k, v])
    }

    /// `o [B, Hq, T, hd]` → `[B, T, hidden]`.
    fn project_out(&self, b: &mut GraphBuilder, spec: &DecoderSpec, o: NodeId) -> Result<NodeId> {
        let (batch, t) = (b.shape(o)[0], b.shape(o)[2]);
        let o = b.swap_axes(o, 1, 2)?;
        let o = b.reshape(o, &[batch, t, spec.heads * spec.head_dim])?;
        self.o.forward(b, o)
    }

    fn forward(&self, b: &mut GraphBuilder, spec: &DecoderSpec, i: usize, x: NodeId, s: &StepInputs) -> Result<NodeId> {
        let hd = spec.head_dim;
        let [q, k, v] = self.qkv(b, spec, i, x, s.positions)?;
        let cache = [1, spec.kv_heads, s.capacity, hd];
        // The cache holds keys and values in their own (promoted) dtype, as mlx-lm's does: with
        // one dtype everywhere that is `s.dtype`; under `native` it follows MLX's promotion.
        let dtype = match promote(b.dtype(k), b.dtype(v), b.options().promotion) {
            Promotion::To(d) => d,
            Promotion::Unsupported(_) => s.dtype,
        };
        let kc = b.state(&format!("layers.{i}.k_cache"), dtype, &cache);
        let vc = b.state(&format!("layers.{i}.v_cache"), dtype, &cache);
        let kc = b.kv_write(kc, k, s.offset)?;
        let vc = b.kv_write(vc, v, s.offset)?;
        let scale = spec.attention_scale();
        let o = b.attention(
            q,
            kc,
            vc,
            s.kv_len,
            scale,
            true,
            spec.window(i),
            spec.options.attn_softcap,
        )?;
        self.project_out(b, spec, o)
    }
}

impl Ffn {
    fn forward(&self, b: &mut GraphBuilder, x: NodeId) -> Result<NodeId> {
        match self {
            Ffn::Dense(mlp) => mlp.forward(b, x),
            Ffn::Sparse(moe) => moe.forward(b, x),
        }
    }
}

impl Mlp {
    pub(crate) fn load(
        w: &Loader,
        prefix: &str,
        d: usize,
        ff: usize,
        bias: bool,
        activation: Activation,
    ) -> Result<Mlp> {
        Ok(Mlp {
            gate: w.linear(&format!("{prefix}.gate_proj"), d, ff, bias)?,
            up: w.linear(&format!("{prefix}.up_proj"), d, ff, bias)?,
            down: w.linear(&format!("{prefix}.down_proj"), ff, d, bias)?,
            activation,
        })
    }

    /// `down(act(gate(x)) · up(x))`
    pub(crate) fn forward(&self, b: &mut GraphBuilder, x: NodeId) -> Result<NodeId> {
        let g = self.gate.forward(b, x)?;
        let g = match self.activation {
            Activation::Silu => b.silu(g)?,
            Activation::GeluTanh => b.unary(UnaryOp::GeluTanh, g)?,
        };
        let u = self.up.forward(b, x)?;
        let h = b.mul(g, u)?;
        self.down.forward(b, h)
    }
}
