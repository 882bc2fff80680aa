//! Linear algebra, fused NN ops, sorting and sampling. Weight-like operands (matmul's `b`,
//! norm weights, quantization scales, embedding tables, frequency tables) keep their stored
//! dtype: kernels widen them on load, so no `AsType` is needed for them. The output dtype is
//! still the MLX promotion of the operands.

use super::GraphBuilder;
use crate::dtype::DType;
use crate::error::{shape_err, Error, Result};
use crate::graph::NodeId;
use crate::op::Op;

fn check_float(op: &'static str, what: &str, d: DType) -> Result<()> {
    if d.is_float() {
        Ok(())
    } else {
        Err(Error::DType(format!("{op}: {what} is {d}, expected a float dtype")))
    }
}

fn check_int(op: &'static str, what: &str, d: DType) -> Result<()> {
    if matches!(d, DType::I32 | DType::U32) {
        Ok(())
    } else {
        Err(Error::DType(format!("{op}: {what} is {d}, expected int32 or uint32")))
    }
}

/// Shapes of MLX's packed quantized weight `[.., N, K·bits/32]` and its scales `[.., N, K/g]`.
fn check_quantized(
    op: &'static str,
    w: (&[usize], DType),
    scales: (&[usize], DType),
    biases: (&[usize], DType),
    bits: u32,
    group_size: usize,
) -> Result<usize> {
    if !matches!(bits, 2 | 4 | 8) {
        return Err(Error::Invalid(format!(
            "{op}: {bits}-bit quantization is not supported (2, 4 or 8)"
        )));
    }
    if !matches!(group_size, 32 | 64 | 128) {
        return Err(Error::Invalid(format!(
            "{op}: group size {group_size} is not supported (32, 64 or 128)"
        )));
    }
    if w.1 != DType::U32 {
        return Err(Error::DType(format!("{op}: packed weight is {}, expected uint32", w.1)));
    }
    check_float(op, "scales", scales.1)?;
    check_float(op, "biases", biases.1)?;
    let per_word = 32 / bits as usize;
    let w_shape = w.0;
    if w_shape.len() < 2 {
        return Err(shape_err(op, format!("packed weight {w_shape:?} must have rank ≥ 2")));
    }
    let k = w_shape[w_shape.len() - 1] * per_word;
    let mut want = w_shape.to_vec();
    *want.last_mut().unwrap() = k / group_size;
    if !k.is_multiple_of(group_size) || scales.0 != want.as_slice() || biases.0 != want.as_slice() {
        return Err(shape_err(
            op,
            format!(
                "packed weight {w_shape:?} ({bits}-bit, group {group_size}, K = {k}) needs scales and biases {want:?}, got {:?} and {:?}",
                scales.0, biases.0
            ),
        ));
    }
    Ok(k)
}

impl GraphBuilder {
    fn float_result(&self, op: &'static str, dtypes: &[DType]) -> Result<DType> {
        let mut d = dtypes[0];
        for &x in dtypes {
            check_float(op, "operand", x)?;
            d = self.promote2(op, d, x)?;
        }
        Ok(d)
    }

    /// `a @ b`; `b` rank 2 is shared across `a`'s batch axes, otherwise batch axes broadcast.
    pub fn matmul(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.matmul_impl(a, b, false)
    }

    /// `a @ bᵀ` for `b [.., N, K]`: a linear layer with weight `[out, in]`.
    pub fn matmul_t(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.matmul_impl(a, b, true)
    }

    fn matmul_impl(&mut self, a: NodeId, b: NodeId, transpose_b: bool) -> Result<NodeId> {
        let (sa, sb) = (self.shape(a).to_vec(), self.shape(b).to_vec());
        if sa.len() < 2 || sb.len() < 2 {
            return Err(shape_err("matmul", format!("operands {sa:?} and {sb:?} need rank ≥ 2")));
        }
        let (m, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
        let (kb, n) = if transpose_b {
            (sb[sb.len() - 1], sb[sb.len() - 2])
        } else {
            (sb[sb.len() - 2], sb[sb.len() - 1])
        };
        if k != kb {
            let t = if transpose_b { "ᵀ" } else { "" };
            return Err(shape_err(
                "matmul",
                format!("a {sa:?} @ b{t} {sb:?}: inner sizes {k} and {kb} differ"),
            ));
        }
        let dtype = self.float_result("matmul", &[self.dtype(a), self.dtype(b)])?;
        let (mut a, mut b) = (a, b);
        let mut batch = sa[..sa.len() - 2].to_vec();
        if sb.len() > 2 {
            batch = super::broadcast_shapes("matmul", &[batch, sb[..sb.len() - 2].to_vec()])?;
            let full = |tail: &[usize]| [batch.as_slice(), tail].concat();
            a = self.broadcast(a, &full(&sa[sa.len() - 2..]), "matmul")?;
            b = self.broadcast(b, &full(&sb[sb.len() - 2..]), "matmul")?;
        }
        let mut shape = batch;
        shape.extend([m, n]);
        Ok(self.push(Op::MatMul { transpose_b }, vec![a, b], shape, dtype, "matmul"))
    }

    /// `x [.., K] @ dequant(w)ᵀ` in MLX's affine layout.
    pub fn quantized_matmul(
        &mut self,
        x: NodeId,
        w: NodeId,
        scales: NodeId,
        biases: NodeId,
        bits: u32,
        group_size: usize,
    ) -> Result<NodeId> {
        let op = "quantized_matmul";
        let k = check_quantized(
            op,
            (self.shape(w), self.dtype(w)),
            (self.shape(scales), self.dtype(scales)),
            (self.shape(biases), self.dtype(biases)),
            bits,
            group_size,
        )?;
        let (sx, sw) = (self.shape(x).to_vec(), self.shape(w).to_vec());
        if sw.len() != 2 || sx.last() != Some(&k) {
            return Err(shape_err(
                op,
                format!("x {sx:?} does not fit packed weight {sw:?} (K = {k})"),
            ));
        }
        let dtype = self.float_result(op, &[self.dtype(x), self.dtype(scales), self.dtype(biases)])?;
        let mut shape = sx;
        *shape.last_mut().unwrap() = sw[0];
        Ok(self.push(
            Op::QuantizedMatMul { bits, group_size },
            vec![x, w, scales, biases],
            shape,
            dtype,
            op,
        ))
    }

    /// Per-token expert matmuls: `x [.., X, K]` (X = 1 or k) with experts `ids [.., k]` of the
    /// stacked weight `[E, N, K·bits/32]`; output `[.., k, N]`.
    #[allow(clippy::too_many_arguments)]
    pub fn gather_qmm(
        &mut self,
        x: NodeId,
        w: NodeId,
        scales: NodeId,
        biases: NodeId,
        ids: NodeId,
        bits: u32,
        group_size: usize,
    ) -> Result<NodeId> {
        let op = "gather_qmm";
        let k = check_quantized(
            op,
            (self.shape(w), self.dtype(w)),
            (self.shape(scales), self.dtype(scales)),
            (self.shape(biases), self.dtype(biases)),
            bits,
            group_size,
        )?;
        check_int(op, "expert ids", self.dtype(ids))?;
        let (sx, sw, si) = (self.shape(x).to_vec(), self.shape(w).to_vec(), self.shape(ids).to_vec());
        let top = si.last().copied().unwrap_or(0);
        let fits = sw.len() == 3
            && sx.len() >= 2
            && si.len() == sx.len() - 1
            && sx[..sx.len() - 2] == si[..si.len() - 1]
            && (sx[sx.len() - 2] == 1 || sx[sx.len() - 2] == top)
            && sx[sx.len() - 1] == k;
        if !fits {
            return Err(shape_err(
                op,
                format!("x {sx:?}, experts {sw:?} (K = {k}) and ids {si:?} do not fit"),
            ));
        }
        let dtype = self.float_result(op, &[self.dtype(x), self.dtype(scales), self.dtype(biases)])?;
        let mut shape = si;
        shape.push(sw[1]);
        let inputs = vec![x, w, scales, biases, ids];
        Ok(self.push(Op::GatherQuantizedMatMul { bits, group_size }, inputs, shape, dtype, op))
    }

    fn check_norm_param(&self, op: &'static str, x: NodeId, p: NodeId) -> Result<()> {
        check_float(op, "parameter", self.dtype(p))?;
        let d = *self.shape(x).last().unwrap_or(&0);
        if self.shape(p) != [d] {
            return Err(shape_err(
                op,
                format!("parameter {:?} does not match x {:?}", self.shape(p), self.shape(x)),
            ));
        }
        Ok(())
    }

    /// RMSNorm over the last axis; `unit_offset` scales by `1 + w` (Gemma).
    pub fn rms_norm(&mut self, x: NodeId, w: NodeId, eps: f32, unit_offset: bool) -> Result<NodeId> {
        check_float("rms_norm", "x", self.dtype(x))?;
        self.check_norm_param("rms_norm", x, w)?;
        let dtype = self.float_result("rms_norm", &[self.dtype(x), self.dtype(w)])?;
        let shape = self.shape(x).to_vec();
        Ok(self.push(Op::RmsNorm { eps, unit_offset }, vec![x, w], shape, dtype, "rms_norm"))
    }

    pub fn layer_norm(&mut self, x: NodeId, w: Option<NodeId>, b: Option<NodeId>, eps: f32) -> Result<NodeId> {
        check_float("layer_norm", "x", self.dtype(x))?;
        let mut dtypes = vec![self.dtype(x)];
        let mut inputs = vec![x];
        for p in [w, b].into_iter().flatten() {
            self.check_norm_param("layer_norm", x, p)?;
            dtypes.push(self.dtype(p));
            inputs.push(p);
        }
        let dtype = self.float_result("layer_norm", &dtypes)?;
        let shape = self.shape(x).to_vec();
        let op = Op::LayerNorm {
            eps,
            has_weight: w.is_some(),
            has_bias: b.is_some(),
        };
        Ok(self.push(op, inputs, shape, dtype, "layer_norm"))
    }

    /// Rotary embedding of `x [B, H, T, D]`; see [`Op::Rope`].
    pub fn rope(
        &mut self,
        x: NodeId,
        positions: NodeId,
        inv_freq: NodeId,
        dims: usize,
        interleaved: bool,
        scale: f32,
    ) -> Result<NodeId> {
        let op = "rope";
        check_float(op, "x", self.dtype(x))?;
        check_int(op, "positions", self.dtype(positions))?;
        check_float(op, "inv_freq", self.dtype(inv_freq))?;
        let (sx, sp) = (self.shape(x).to_vec(), self.shape(positions).to_vec());
        if sx.len() != 4 {
            return Err(shape_err(op, format!("x {sx:?} must be [B, H, T, D]")));
        }
        let (b, t, d) = (sx[0], sx[2], sx[3]);
        if dims == 0 || !dims.is_multiple_of(2) || dims > d {
            return Err(shape_err(
                op,
                format!("rotary dims {dims} must be even and ≤ head dim {d}"),
            ));
        }
        if sp != [t] && sp != [b, t] {
            return Err(shape_err(
                op,
                format!("positions {sp:?} must be [T] or [B, T] for x {sx:?}"),
            ));
        }
        if self.shape(inv_freq) != [dims / 2] {
            return Err(shape_err(
                op,
                format!("inv_freq {:?} must be [{}]", self.shape(inv_freq), dims / 2),
            ));
        }
        let dtype = self.dtype(x);
        Ok(self.push(
            Op::Rope {
                dims,
                interleaved,
                scale,
            },
            vec![x, positions, inv_freq],
            sx,
            dtype,
            op,
        ))
    }

    fn check_len(&self, op: &'static str, what: &str, len: NodeId, batch: usize) -> Result<()> {
        check_int(op, what, self.dtype(len))?;
        let s = self.shape(len);
        if !(s.is_empty() || s == [batch]) {
            return Err(shape_err(op, format!("{what} {s:?} must be a scalar or [{batch}]")));
        }
        Ok(())
    }

    /// Attention of `q` over the first `kv_len` cached keys and values; see [`Op::Attention`].
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &mut self,
        q: NodeId,
        k: NodeId,
        v: NodeId,
        kv_len: NodeId,
        scale: f32,
        causal: bool,
        window: Option<usize>,
        softcap: Option<f32>,
    ) -> Result<NodeId> {
        let op = "attention";
        let (sq, sk, sv) = (self.shape(q).to_vec(), self.shape(k).to_vec(), self.shape(v).to_vec());
        let fits = sq.len() == 4
            && sk.len() == 4
            && sv.len() == 4
            && sk[0] == sq[0]
            && sv[0] == sq[0]
            && sk[1] == sv[1]
            && sk[1] > 0
            && sq[1] % sk[1] == 0
            && sk[2] == sv[2]
            && sk[3] == sq[3];
        if !fits {
            return Err(shape_err(
                op,
                format!("q {sq:?}, k {sk:?}, v {sv:?} do not fit [B, Hq, T, D] / [B, Hkv, S, D]"),
            ));
        }
        let dtype = self.attention_operands(op, [q, k, v], kv_len, sq[0], window)?;
        let shape = vec![sq[0], sq[1], sq[2], sv[3]];
        Ok(self.push(
            Op::Attention {
                scale,
                causal,
                window,
                softcap,
            },
            vec![q, k, v, kv_len],
            shape,
            dtype,
            op,
        ))
    }

    /// Attention of `q` over the first `kv_len` positions of each row in a paged pool; see
    /// [`Op::PagedAttention`].
    #[allow(clippy::too_many_arguments)]
    pub fn paged_attention(
        &mut self,
        q: NodeId,
        k: NodeId,
        v: NodeId,
        kv_len: NodeId,
        table: NodeId,
        block_size: usize,
        scale: f32,
        causal: bool,
        window: Option<usize>,
        softcap: Option<f32>,
    ) -> Result<NodeId> {
        let op = "paged_attention";
        let (sq, sk, sv) = (self.shape(q).to_vec(), self.shape(k).to_vec(), self.shape(v).to_vec());
        let st = self.shape(table).to_vec();
        let fits = sq.len() == 4
            && sk.len() == 3
            && sv.len() == 3
            && sk[0] == sv[0]
            && sk[1] == sv[1]
            && sk[1] > 0
            && sq[1] % sk[1] == 0
            && sk[2] == sq[3];
        if !fits {
            return Err(shape_err(
                op,
                format!("q {sq:?}, k {sk:?}, v {sv:?} do not fit [B, Hq, T, D] / [P, Hkv, D]"),
            ));
        }
        if st.len() != 2 || st[0] != sq[0] || st[1] == 0 {
            return Err(shape_err(op, format!("block table {st:?} must be [{}, M > 0]", sq[0])));
        }
        check_int(op, "block table", self.dtype(table))?;
        if block_size == 0 || sk[0] % block_size != 0 {
            return Err(shape_err(
                op,
                format!("a pool of {} slots is not whole blocks of {block_size}", sk[0]),
            ));
        }
        let dtype = self.attention_operands(op, [q, k, v], kv_len, sq[0], window)?;
        let shape = vec![sq[0], sq[1], sq[2], sv[2]];
        Ok(self.push(
            Op::PagedAttention {
                scale,
                causal,
                window,
                softcap,
                block_size,
            },
            vec![q, k, v, kv_len, table],
            shape,
            dtype,
            op,
        ))
    }

    /// The checks both attentions make past their shapes (window, length, cache versions, k and
    /// v of one dtype); the result's dtype.
    fn attention_operands(
        &self,
        op: &'static str,
        [q, k, v]: [NodeId; 3],
        kv_len: NodeId,
        batch: usize,
        window: Option<usize>,
    ) -> Result<DType> {
        if window == Some(0) {
            return Err(shape_err(op, "a sliding window of 0 keys attends to nothing"));
        }
        self.check_len(op, "kv_len", kv_len, batch)?;
        self.check_latest(op, k)?;
        self.check_latest(op, v)?;
        if self.dtype(k) != self.dtype(v) {
            return Err(Error::DType(format!(
                "{op}: k is {} but v is {}",
                self.dtype(k),
                self.dtype(v)
            )));
        }
        self.float_result(op, &[self.dtype(q), self.dtype(k)])
    }

    /// The state behind `x` if `x` is a state or a write to one.
    fn state_root(&self, x: NodeId) -> Option<NodeId> {
        let mut root = x;
        while let Op::KvWrite = self.graph().node(root).op {
            root = self.graph().node(root).inputs[0];
        }
        matches!(self.graph().node(root).op, Op::State { .. }).then_some(root)
    }

    /// Fails when `x` is a version of a state that a later write has replaced.
    fn check_latest(&self, op: &'static str, x: NodeId) -> Result<()> {
        if let Some(root) = self.state_root(x) {
            let latest = self.latest_write.get(&root).copied().unwrap_or(root);
            if latest != x {
                return Err(Error::Invalid(format!(
                    "{op}: reads state node {} after a later write to it",
                    root.0
                )));
            }
        }
        Ok(())
    }

    /// Writes `new [B, H, T, D]` into `cache` (a state, or the latest write to one) at `pos`.
    pub fn kv_write(&mut self, cache: NodeId, new: NodeId, pos: NodeId) -> Result<NodeId> {
        let op = "kv_write";
        let Some(root) = self.state_root(cache) else {
            return Err(Error::Invalid("kv_write: the cache must be a state node".into()));
        };
        self.check_latest(op, cache)?;
        let (sc, sn) = (self.shape(cache).to_vec(), self.shape(new).to_vec());
        // A run must fit the cache; tokens at their own slots may share one (a batch's padding).
        let per_token = self.shape(pos).len() == 2;
        if sc.len() != 4
            || sn.len() != 4
            || sc[0] != sn[0]
            || sc[1] != sn[1]
            || sc[3] != sn[3]
            || (!per_token && sn[2] > sc[2])
        {
            return Err(shape_err(op, format!("new {sn:?} does not fit cache {sc:?}")));
        }
        if self.shape(pos).len() == 2 {
            // One slot a token.
            check_int(op, "pos", self.dtype(pos))?;
            if self.shape(pos) != [sn[0], sn[2]] {
                let s = self.shape(pos).to_vec();
                return Err(shape_err(
                    op,
                    format!("pos {s:?} must be [{}, {}], a slot a token", sn[0], sn[2]),
                ));
            }
        } else {
            self.check_len(op, "pos", pos, sc[0])?;
        }
        let dtype = self.dtype(cache);
        let new = self.cast(new, dtype, op);
        let write = self.push(Op::KvWrite, vec![cache, new, pos], sc, dtype, op);
        self.latest_write.insert(root, write);
        Ok(write)
    }

    /// Rows of `table [V, D]` at `ids [..]`.
    pub fn gather(&mut self, table: NodeId, ids: NodeId) -> Result<NodeId> {
        check_int("gather", "ids", self.dtype(ids))?;
        let st = self.shape(table).to_vec();
        if st.len() != 2 {
            return Err(shape_err("gather", format!("table {st:?} must be [V, D]")));
        }
        let mut shape = self.shape(ids).to_vec();
        shape.push(st[1]);
        let dtype = self.dtype(table);
        Ok(self.push(Op::Gather, vec![table, ids], shape, dtype, "gather"))
    }

    /// Quantized embedding rows, in the scales' (promoted) dtype as MLX gives them.
    pub fn quantized_gather(
        &mut self,
        w: NodeId,
        scales: NodeId,
        biases: NodeId,
        ids: NodeId,
        bits: u32,
        group_size: usize,
    ) -> Result<NodeId> {
        let dtype = self.float_result("quantized_gather", &[self.dtype(scales), self.dtype(biases)])?;
        self.quantized_gather_as(w, scales, biases, ids, bits, group_size, dtype)
    }

    /// Quantized embedding rows dequantized straight into `dtype` (e.g. f32 activations from
    /// bf16 scales, with no bf16 rounding in between).
    #[allow(clippy::too_many_arguments)]
    pub fn quantized_gather_as(
        &mut self,
        w: NodeId,
        scales: NodeId,
        biases: NodeId,
        ids: NodeId,
        bits: u32,
        group_size: usize,
        dtype: DType,
    ) -> Result<NodeId> {
        let op = "quantized_gather";
        let d = check_quantized(
            op,
            (self.shape(w), self.dtype(w)),
            (self.shape(scales), self.dtype(scales)),
            (self.shape(biases), self.dtype(biases)),
            bits,
            group_size,
        )?;
        check_int(op, "ids", self.dtype(ids))?;
        check_float(op, "output", dtype)?;
        if self.shape(w).len() != 2 {
            return Err(shape_err(
                op,
                format!("packed table {:?} must be rank 2", self.shape(w)),
            ));
        }
        let mut shape = self.shape(ids).to_vec();
        shape.push(d);
        Ok(self.push(
            Op::QuantizedGather { bits, group_size },
            vec![w, scales, biases, ids],
            shape,
            dtype,
            op,
        ))
    }

    pub fn take_along_axis(&mut self, x: NodeId, idx: NodeId, axis: isize) -> Result<NodeId> {
        let op = "take_along_axis";
        let axis = self.axis(op, x, axis)?;
        check_int(op, "indices", self.dtype(idx))?;
        let (sx, si) = (self.shape(x).to_vec(), self.shape(idx).to_vec());
        if sx.len() != si.len() || sx.iter().zip(&si).enumerate().any(|(i, (a, b))| i != axis && a != b) {
            return Err(shape_err(
                op,
                format!("indices {si:?} do not fit x {sx:?} on axis {axis}"),
            ));
        }
        let dtype = self.dtype(x);
        Ok(self.push(Op::TakeAlongAxis { axis }, vec![x, idx], si, dtype, op))
    }

    pub fn topk(&mut self, x: NodeId, k: usize) -> Result<NodeId> {
        self.topk_ties(x, k, false)
    }

    /// [`GraphBuilder::topk`], ties going to the higher index when `higher_on_ties`.
    pub fn topk_ties(&mut self, x: NodeId, k: usize, higher_on_ties: bool) -> Result<NodeId> {
        let s = self.shape(x).to_vec();
        let n = *s.last().ok_or_else(|| shape_err("topk", "scalar input"))?;
        if k == 0 || k > n {
            return Err(shape_err("topk", format!("k = {k} for a last axis of {n}")));
        }
        let mut shape = s;
        *shape.last_mut().unwrap() = k;
        Ok(self.push(Op::TopK { k, higher_on_ties }, vec![x], shape, DType::U32, "topk"))
    }

    pub fn argsort(&mut self, x: NodeId, descending: bool) -> Result<NodeId> {
        let shape = self.shape(x).to_vec();
        if shape.is_empty() {
            return Err(shape_err("argsort", "scalar input"));
        }
        Ok(self.push(Op::ArgSort { descending }, vec![x], shape, DType::U32, "argsort"))
    }

    /// One token per row of `logits [B, V]` by the Gumbel-max trick; `counter` (`u32 []`)
    /// changes the draw from step to step.
    pub fn sample_categorical(&mut self, logits: NodeId, counter: NodeId, seed: u64) -> Result<NodeId> {
        let op = "sample_categorical";
        check_float(op, "logits", self.dtype(logits))?;
        if self.dtype(counter) != DType::U32 || !self.shape(counter).is_empty() {
            return Err(Error::DType(format!("{op}: counter must be a uint32 scalar")));
        }
        let s = self.shape(logits).to_vec();
        if s.len() != 2 || s[1] == 0 {
            return Err(shape_err(op, format!("logits {s:?} must be [B, V]")));
        }
        Ok(self.push(
            Op::SampleCategorical { seed },
            vec![logits, counter],
            vec![s[0]],
            DType::U32,
            op,
        ))
    }
}
