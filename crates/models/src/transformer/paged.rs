//! The decoder over a paged KV cache, for batches of independent sequences.
//!
//! Each layer's keys (and values) live in one pool state `layers.{i}.{k,v}_pool` of shape
//! `[1, 1, blocks · block_size, Hkv · hd]`: token-major, so a pool slot `block · block_size +
//! offset` holds one position of one sequence. Writes are one `kv_write` a pool and layer, each
//! token at its host-computed slot. A decode step's `paged_attention` reads each row's blocks
//! in place through its block table; a prefill chunk gathers them into a dense
//! `[B, Hkv, M · block_size, hd]` view for `attention`. Both read only the first `kv_len`
//! positions of each row. One row's arithmetic never depends on the other rows.

use anyhow::{ensure, Result};
use mlxcel_core::{DType, GraphBuilder, NodeId};

use super::{Attention, DecoderSpec, Transformer};

/// One batched step's runtime inputs, made by the engine.
pub struct PagedStep {
    /// `i32 [B, T]`
    pub tokens: NodeId,
    /// `i32 [B, T]`: each token's position in its sequence.
    pub positions: NodeId,
    /// `i32 [B]`: valid positions of each row after this step's writes.
    pub kv_len: NodeId,
    /// `i32 [B, M]`: each row's pool blocks in position order (padding: block 0).
    pub block_table: NodeId,
    /// `i32 [B · T]`: the pool slot of each token, row by row.
    pub write_slots: NodeId,
    /// Blocks in the device pool, the never-lent block 0 included.
    pub pool_blocks: usize,
    pub block_size: usize,
    /// Activations and cache dtype.
    pub dtype: DType,
    /// Decode reads the pool in place (`paged_attention`); false gathers it as prefill does
    /// (for comparison).
    pub in_place: bool,
}

impl Transformer {
    /// Logits `[B, 1, vocab]` of each row's last token, writing the step's keys and values into
    /// the pool states.
    pub fn forward_paged(&self, b: &mut GraphBuilder, s: &PagedStep) -> Result<NodeId> {
        let t = b.shape(s.tokens)[1];
        let tokens: usize = b.shape(s.tokens).iter().product();
        ensure!(
            b.shape(s.write_slots) == [tokens],
            "paged step: {:?} write slots for {tokens} tokens",
            b.shape(s.write_slots)
        );
        self.decode(b, s.tokens, s.dtype, Some(t), |b, i, attn, h| {
            attn.forward_paged(b, &self.spec, i, h, s)
        })
    }
}

impl Attention {
    fn forward_paged(
        &self,
        b: &mut GraphBuilder,
        spec: &DecoderSpec,
        i: usize,
        x: NodeId,
        s: &PagedStep,
    ) -> Result<NodeId> {
        let (batch, t) = (b.shape(x)[0], b.shape(x)[1]);
        let (hkv, hd) = (spec.kv_heads, spec.head_dim);
        let m = b.shape(s.block_table)[1];
        let [q, k, v] = self.qkv(b, spec, i, x, s.positions)?;
        let slots = s.pool_blocks * s.block_size;
        let pool = [1, 1, slots, hkv * hd];
        let write = |b: &mut GraphBuilder, kind: &str, new: NodeId| -> Result<NodeId> {
            // [B, Hkv, T, hd] → [1, 1, B·T, Hkv·hd]: one pool row per token, each at its slot.
            let new = b.swap_axes(new, 1, 2)?;
            let new = b.reshape(new, &[1, 1, batch * t, hkv * hd])?;
            let cache = b.state(&format!("layers.{i}.{kind}_pool"), s.dtype, &pool);
            let at = b.reshape(s.write_slots, &[1, batch * t])?;
            Ok(b.kv_write(cache, new, at)?)
        };
        let (kp, vp) = (write(b, "k", k)?, write(b, "v", v)?);
        let scale = spec.attention_scale();
        let (window, softcap) = (spec.window(i), spec.options.attn_softcap);
        let o = if t == 1 && s.in_place {
            // Decode: attention reads each row's blocks in the pool where they lie.
            let kp = b.reshape(kp, &[slots, hkv, hd])?;
            let vp = b.reshape(vp, &[slots, hkv, hd])?;
            let (len, table) = (s.kv_len, s.block_table);
            b.paged_attention(q, kp, vp, len, table, s.block_size, scale, true, window, softcap)?
        } else {
            // A prefill chunk: each row's blocks gathered into a dense [B, Hkv, M·bs, hd] view,
            // for the prefill kernels (on CUDA, the tensor-core one), the copy shared by T queries.
            let dense = |b: &mut GraphBuilder, cache: NodeId| -> Result<NodeId> {
                let blocks = b.reshape(cache, &[s.pool_blocks, s.block_size * hkv * hd])?;
                let rows = b.gather(blocks, s.block_table)?;
                let rows = b.reshape(rows, &[batch, m * s.block_size, hkv, hd])?;
                Ok(b.swap_axes(rows, 1, 2)?)
            };
            let (kc, vc) = (dense(b, kp)?, dense(b, vp)?);
            b.attention(q, kc, vc, s.kv_len, scale, true, window, softcap)?
        };
        self.project_out(b, spec, o)
    }
}
