//! The decoder over a paged KV cache, for batches of independent sequences.
//!
//! Each layer's keys (and values) live in one pool state `layers.{i}.{k,v}_pool` of shape
//! `[1, 1, blocks · block_size, Hkv · hd]`: token-major, so a pool slot `block · block_size +
//! offset` holds one position of one sequence. Writes are `kv_write`s of contiguous runs
//! ("segments") at host-computed slots; reads gather each row's blocks through its block table
//! into a dense `[B, Hkv, M · block_size, hd]` view for `attention`, which reads only the first
//! `kv_len` positions of each row. Only existing ops are used, so every backend runs it; one
//! row's arithmetic never depends on the other rows.

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
    /// `i32 [W]`: the pool slot where each segment's first token goes.
    pub write_slots: NodeId,
    /// `(row, first token, length)` of each run of tokens written contiguously, in
    /// `write_slots` order; together they cover every `(row, token)` once.
    pub segments: Vec<(usize, usize, usize)>,
    /// Blocks in the device pool, the never-lent block 0 included.
    pub pool_blocks: usize,
    pub block_size: usize,
    /// Activations and cache dtype.
    pub dtype: DType,
}

impl Transformer {
    /// Logits `[B, 1, vocab]` of each row's last token, writing the step's keys and values into
    /// the pool states.
    pub fn forward_paged(&self, b: &mut GraphBuilder, s: &PagedStep) -> Result<NodeId> {
        let t = b.shape(s.tokens)[1];
        let covered: usize = s.segments.iter().map(|seg| seg.2).sum();
        ensure!(
            covered == b.shape(s.tokens).iter().product::<usize>(),
            "paged step: segments cover {covered} tokens"
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
        let pool = [1, 1, s.pool_blocks * s.block_size, hkv * hd];
        let read = |b: &mut GraphBuilder, kind: &str, new: NodeId| -> Result<NodeId> {
            // [B, Hkv, T, hd] → [B, 1, T, Hkv·hd]: one pool row per token.
            let new = b.swap_axes(new, 1, 2)?;
            let new = b.reshape(new, &[batch, 1, t, hkv * hd])?;
            let mut cache = b.state(&format!("layers.{i}.{kind}_pool"), s.dtype, &pool);
            for (w, &(row, start, len)) in s.segments.iter().enumerate() {
                let part = b.slice_axis(new, 0, row, row + 1)?;
                let part = b.slice_axis(part, 2, start, start + len)?;
                let slot = b.slice_axis(s.write_slots, 0, w, w + 1)?;
                cache = b.kv_write(cache, part, slot)?;
            }
            // [blocks, bs·Hkv·hd] gathered by [B, M] → [B, M·bs, Hkv, hd] → [B, Hkv, M·bs, hd]
            let blocks = b.reshape(cache, &[s.pool_blocks, s.block_size * hkv * hd])?;
            let rows = b.gather(blocks, s.block_table)?;
            let rows = b.reshape(rows, &[batch, m * s.block_size, hkv, hd])?;
            Ok(b.swap_axes(rows, 1, 2)?)
        };
        let kc = read(b, "k", k)?;
        let vc = read(b, "v", v)?;
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
