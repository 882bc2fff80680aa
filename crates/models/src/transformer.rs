//! The pre-norm decoder every supported architecture is a configuration of: token embedding,
//! `layers × (RMSNorm → attention → residual, RMSNorm → gated MLP → residual)`, final norm,
//! output head. Architectures differ in a `DecoderSpec` and in which tensors exist.

use anyhow::Result;
use mlxcel_core::{DType, GraphBuilder, NodeId};

use crate::layers::{Embedding, Linear, Loader, RmsNorm, Rope};

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

struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
}

struct DecoderLayer {
    input_norm: RmsNorm,
    attn: Attention,
    post_attn_norm: RmsNorm,
    mlp: Mlp,
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
        let mut layers = Vec::with_capacity(spec.layers);
        for i in 0..spec.layers {
            let p = format!("model.layers.{i}");
            let a = format!("{p}.self_attn");
            let qk_norm = |n: &str| -> Result<Option<RmsNorm>> {
                Ok(if spec.qk_norm {
                    Some(w.rms_norm(&format!("{a}.{n}"), hd, spec.rms_eps)?)
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
            let mlp = Mlp {
                gate: w.linear(&format!("{m}.gate_proj"), d, spec.intermediate, spec.mlp_bias)?,
                up: w.linear(&format!("{m}.up_proj"), d, spec.intermediate, spec.mlp_bias)?,
                down: w.linear(&format!("{m}.down_proj"), spec.intermediate, d, spec.mlp_bias)?,
            };
            layers.push(DecoderLayer {
                input_norm: w.rms_norm(&format!("{p}.input_layernorm"), d, spec.rms_eps)?,
                attn,
                post_attn_norm: w.rms_norm(&format!("{p}.post_attention_layernorm"), d, spec.rms_eps)?,
                mlp,
            });
        }
        // Tied models may still carry an lm_head (some converters write it); use it if present.
        let lm_head = if !spec.tie_embeddings || w.checkpoint.contains("lm_head.weight") {
            Some(w.linear("lm_head", d, spec.vocab, false)?)
        } else {
            None
        };
        Ok(Transformer {
            embed: w.embedding("model.embed_tokens", spec.vocab, d)?,
            layers,
            norm: w.rms_norm("model.norm", d, spec.rms_eps)?,
            lm_head,
            spec,
        })
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
        let x = b.add(x, a)?;
        let h = self.post_attn_norm.forward(b, x)?;
        let h = b.name(h, "ffn_norm");
        let m = self.mlp.forward(b, h)?;
        let m = b.name(m, "ffn_out");
        Ok(b.add(x, m)?)
    }
}

impl Attention {
    /// `x [B, T, hidden]` → q `[B, Hq, T, hd]`, k and v `[B, Hkv, T, hd]`, RoPE at `positions`.
    fn qkv(&self, b: &mut GraphBuilder, spec: &DecoderSpec, x: NodeId, positions: NodeId) -> Result<[NodeId; 3]> {
        let (batch, t, hd) = (b.shape(x)[0], b.shape(x)[1], spec.head_dim);
        // [B, T, H·hd] → [B, T, H, hd] (→ per-head norm) → [B, H, T, hd]
        let heads = |b: &mut GraphBuilder, proj: &Linear, n: usize, norm: &Option<RmsNorm>| -> Result<NodeId> {
            let y = proj.forward(b, x)?;
            let mut y = b.reshape(y, &[batch, t, n, hd])?;
            if let Some(norm) = norm {
                y = norm.forward(b, y)?;
            }
            Ok(b.swap_axes(y, 1, 2)?)
        };
        let q = heads(b, &self.q, spec.heads, &self.q_norm)?;
        let k = heads(b, &self.k, spec.kv_heads, &self.k_norm)?;
        let v = heads(b, &self.v, spec.kv_heads, &None)?;
        let q = spec.rope.forward(b, q, positions)?;
        let k = spec.rope.forward(b, k, positions)?;
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
        let [q, k, v] = self.qkv(b, spec, x, s.positions)?;
        let cache = [1, spec.kv_heads, s.capacity, hd];
        let kc = b.state(&format!("layers.{i}.k_cache"), s.dtype, &cache);
        let vc = b.state(&format!("layers.{i}.v_cache"), s.dtype, &cache);
        let kc = b.kv_write(kc, k, s.offset)?;
        let vc = b.kv_write(vc, v, s.offset)?;
        let scale = 1.0 / (hd as f32).sqrt();
        let o = b.attention(q, kc, vc, s.kv_len, scale, true, None, None)?;
        self.project_out(b, spec, o)
    }
}

impl Mlp {
    /// `down(silu(gate(x)) · up(x))`
    fn forward(&self, b: &mut GraphBuilder, x: NodeId) -> Result<NodeId> {
        let g = self.gate.forward(b, x)?;
        let g = b.silu(g)?;
        let u = self.up.forward(b, x)?;
        let h = b.mul(g, u)?;
        self.down.forward(b, h)
    }
}
