//! A naive interpreter of whole graphs: the oracle every backend's op cases are checked against.
//! It is written to be obviously right, not fast: every value is a row-major `Vec<f64>`, every op
//! is a plain loop that follows its doc comment in [`crate::op`], and each node's result is
//! rounded to the node's dtype exactly as storing it would round (`round_to`).
//!
//! Choices the op docs leave open, made here (backends must agree):
//! - integer arithmetic is exact and then saturates on storing, like `AsType` (the op cases
//!   avoid overflow, where hardware would wrap instead);
//! - `Maximum`, `Minimum` and the `Max`/`Min` reductions propagate NaN; sorting treats NaN as
//!   larger than every number;
//! - an attention window applies with or without `causal`: the query at position `p` sees key
//!   `j` only if `j > p - window`;
//! - a node that reads a state directly sees its value from before any `KvWrite` in the same
//!   graph: writes are visible only through the `KvWrite` chain.

use std::cmp::Ordering;
use std::f64::consts::{PI, SQRT_2};

use half::{bf16, f16};

use crate::backend::check_inputs;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::{Graph, Node};
use crate::op::{BinaryOp, CompareOp, Op, ReduceOp, UnaryOp};
use crate::quant::unpack;
use crate::rng::gumbel;
use crate::tensor::{numel, HostTensor, Storage};

/// One node's value: elements already rounded to the node's dtype, row-major in `shape`.
struct Value {
    shape: Vec<usize>,
    data: Vec<f64>,
}

/// Runs `graph` on `inputs` (in [`Graph::inputs`] order). States named in `states` start with
/// those values, the others at zero. Returns the graph's outputs.
pub fn evaluate(graph: &Graph, inputs: &[HostTensor], states: &[(String, HostTensor)]) -> Result<Vec<HostTensor>> {
    graph.validate()?;
    check_inputs(graph, inputs)?;
    for (name, _) in states {
        if !graph
            .nodes
            .iter()
            .any(|n| matches!(&n.op, Op::State { name: s } if s == name))
        {
            return Err(Error::Invalid(format!("state {name} is not in the graph")));
        }
    }
    let mut next_input = inputs.iter();
    let mut values: Vec<Value> = Vec::with_capacity(graph.nodes.len());
    for (i, node) in graph.nodes.iter().enumerate() {
        let data = match &node.op {
            Op::Parameter { data, .. } | Op::Constant { data } => leaf(node, data)?,
            Op::Input { name } => match next_input.next() {
                Some(t) => t.to_f64_vec(),
                None => return Err(Error::Runtime(format!("no value for input {name}"))),
            },
            Op::State { name } => match states.iter().find(|(n, _)| n == name) {
                Some((_, t)) => leaf(node, t)?,
                None => vec![0.0; numel(&node.shape)],
            },
            _ => {
                let args: Vec<&Value> = node.inputs.iter().map(|id| &values[id.index()]).collect();
                compute(node, &args)?
            }
        };
        if data.len() != numel(&node.shape) {
            return Err(Error::Invalid(format!(
                "node {i} ({}) made {} values for shape {:?}",
                node.op.name(),
                data.len(),
                node.shape
            )));
        }
        let data = data.into_iter().map(|v| round_to(node.dtype, v)).collect();
        values.push(Value {
            shape: node.shape.clone(),
            data,
        });
    }
    graph
        .outputs
        .iter()
        .map(|&o| to_host(graph.node(o).dtype, &values[o.index()]))
        .collect()
}

/// A leaf's values, after checking that the tensor fits the node.
fn leaf(node: &Node, t: &HostTensor) -> Result<Vec<f64>> {
    if t.dtype != node.dtype || t.shape != node.shape {
        return Err(Error::Runtime(format!(
            "{}: expected {} {:?}, got {} {:?}",
            node.op.name(),
            node.dtype,
            node.shape,
            t.dtype,
            t.shape
        )));
    }
    Ok(t.to_f64_vec())
}

/// `v` as storing it in `dtype` leaves it, by [`crate::tensor::convert_elements`]'s rules: floats
/// go through f32 and round to nearest even, integers truncate toward zero and saturate (NaN to
/// 0), bool is `v != 0`.
fn round_to(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F32 => v as f32 as f64,
        DType::F16 => f16::from_f32(v as f32).to_f64(),
        DType::BF16 => bf16::from_f32(v as f32).to_f64(),
        DType::I32 => v as i32 as f64,
        DType::U32 => v as u32 as f64,
        DType::U8 => v as u8 as f64,
        DType::Bool => f64::from(u8::from(v != 0.0)),
    }
}

fn to_host(dtype: DType, v: &Value) -> Result<HostTensor> {
    let mut bytes = Vec::with_capacity(v.data.len() * dtype.size());
    for &x in &v.data {
        match dtype {
            DType::F32 => bytes.extend_from_slice(&(x as f32).to_le_bytes()),
            DType::F16 => bytes.extend_from_slice(&f16::from_f32(x as f32).to_le_bytes()),
            DType::BF16 => bytes.extend_from_slice(&bf16::from_f32(x as f32).to_le_bytes()),
            DType::I32 => bytes.extend_from_slice(&(x as i32).to_le_bytes()),
            DType::U32 => bytes.extend_from_slice(&(x as u32).to_le_bytes()),
            DType::U8 | DType::Bool => bytes.push(x as u8),
        }
    }
    HostTensor::from_bytes(dtype, v.shape.clone(), Storage::from_vec(bytes))
}

/// One non-leaf node's values (before rounding to its dtype) from its operands' values.
fn compute(node: &Node, x: &[&Value]) -> Result<Vec<f64>> {
    let out = match &node.op {
        Op::Unary(op) => x[0].data.iter().map(|&v| unary(*op, v)).collect(),
        Op::Binary(op) => zip2(x[0], x[1], |a, b| binary(*op, a, b))?,
        Op::Compare(op) => zip2(x[0], x[1], |a, b| f64::from(u8::from(compare(*op, a, b))))?,
        Op::Where => select(x[0], x[1], x[2])?,
        // The conversion is the rounding to the node's dtype that every node gets.
        Op::AsType | Op::Reshape => x[0].data.clone(),
        Op::Reduce { op, axis, .. } => lanes(x[0], *axis).iter().map(|lane| reduce(*op, lane)).collect(),
        Op::Softmax { axis } => map_lanes(x[0], *axis, softmax),
        Op::CumSum { axis, reverse } => map_lanes(x[0], *axis, |lane| cumsum(lane, *reverse)),
        Op::MatMul { transpose_b } => matmul(x[0], x[1], *transpose_b)?,
        Op::QuantizedMatMul { bits, group_size } => quantized_matmul(x[0], [x[1], x[2], x[3]], *bits, *group_size),
        Op::GatherQuantizedMatMul { bits, group_size } => {
            gather_qmm(x[0], [x[1], x[2], x[3]], x[4], *bits, *group_size)?
        }
        Op::RmsNorm { eps, unit_offset } => rms_norm(x[0], x[1], *eps as f64, *unit_offset),
        Op::LayerNorm {
            eps,
            has_weight,
            has_bias,
        } => {
            let weight = has_weight.then(|| x[1]);
            let bias = has_bias.then(|| x[1 + usize::from(*has_weight)]);
            layer_norm(x[0], weight, bias, *eps as f64)
        }
        Op::Rope {
            dims,
            interleaved,
            scale,
        } => rope(x[0], x[1], x[2], *dims, *interleaved, *scale as f64),
        Op::Attention {
            scale,
            causal,
            window,
            softcap,
        } => {
            let mask = Mask {
                causal: *causal,
                window: *window,
            };
            attention([x[0], x[1], x[2]], x[3], *scale as f64, mask, softcap.map(f64::from))?
        }
        Op::PagedAttention {
            scale,
            causal,
            window,
            softcap,
            block_size,
        } => {
            let mask = Mask {
                causal: *causal,
                window: *window,
            };
            let qkv = [x[0], x[1], x[2]];
            paged_attention(
                qkv,
                x[3],
                x[4],
                *block_size,
                *scale as f64,
                mask,
                softcap.map(f64::from),
            )?
        }
        Op::KvWrite => kv_write(x[0], x[1], x[2])?,
        Op::Gather => gather(x[0], x[1])?,
        Op::QuantizedGather { bits, group_size } => quantized_gather([x[0], x[1], x[2]], x[3], *bits, *group_size)?,
        Op::TakeAlongAxis { axis } => take_along_axis(x[0], x[1], *axis)?,
        Op::Transpose { perm } => transpose(x[0], perm, &node.shape),
        Op::Slice { start, step, .. } => slice(x[0], start, step, &node.shape),
        Op::Concat { axis } => concat(x, *axis),
        Op::Broadcast => broadcast(x[0], &node.shape),
        Op::TopK { k, higher_on_ties } => last_axis_lanes(x[0])
            .iter()
            .flat_map(|lane| {
                if !higher_on_ties {
                    return sorted_indices(lane, true).take(*k).collect::<Vec<_>>();
                }
                // Higher index first among equals: the lower-first order of the reversed lane.
                let reversed: Vec<f64> = lane.iter().rev().copied().collect();
                let last = (lane.len() - 1) as f64;
                sorted_indices(&reversed, true).take(*k).map(|i| last - i).collect()
            })
            .collect(),
        Op::ArgSort { descending } => last_axis_lanes(x[0])
            .iter()
            .flat_map(|lane| sorted_indices(lane, *descending))
            .collect(),
        Op::SampleCategorical { seed } => sample_categorical(x[0], x[1], *seed),
        Op::Parameter { .. } | Op::Constant { .. } | Op::Input { .. } | Op::State { .. } => {
            return Err(Error::Invalid(format!("{} is a leaf, not computed", node.op.name())))
        }
    };
    Ok(out)
}

// ---- elementwise ----

fn unary(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Silu => x / (1.0 + (-x).exp()),
        UnaryOp::GeluErf => 0.5 * x * (1.0 + erf(x / SQRT_2)),
        UnaryOp::GeluTanh => 0.5 * x * (1.0 + ((2.0 / PI).sqrt() * (x + 0.044715 * x * x * x)).tanh()),
        UnaryOp::Softcap(cap) => cap as f64 * (x / cap as f64).tanh(),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
    }
}

/// `erf(x)` to about 1e-14 from the series `erf x = 2/√π · e^(-x²) · Σₙ (2x²)ⁿ x / (1·3·…·(2n+1))`,
/// whose terms all share one sign, so nothing cancels. Past |x| = 6, erf is ±1 within 1e-17.
fn erf(x: f64) -> f64 {
    if x.is_nan() || x.abs() > 6.0 {
        return x.signum();
    }
    let (mut term, mut sum, mut n) = (x, x, 0.0);
    while term.abs() > 1e-17 * sum.abs() {
        n += 1.0;
        term *= 2.0 * x * x / (2.0 * n + 1.0);
        sum += term;
    }
    2.0 / PI.sqrt() * (-x * x).exp() * sum
}

fn binary(op: BinaryOp, a: f64, b: f64) -> f64 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Maximum if a.is_nan() || b.is_nan() => f64::NAN,
        BinaryOp::Minimum if a.is_nan() || b.is_nan() => f64::NAN,
        BinaryOp::Maximum => a.max(b),
        BinaryOp::Minimum => a.min(b),
    }
}

fn compare(op: CompareOp, a: f64, b: f64) -> bool {
    match op {
        CompareOp::Eq => a == b,
        CompareOp::Ne => a != b,
        CompareOp::Lt => a < b,
        CompareOp::Le => a <= b,
        CompareOp::Gt => a > b,
        CompareOp::Ge => a >= b,
    }
}

/// `f(a[i], b[i])` for operands of one shape (the builder broadcasts them first).
fn zip2(a: &Value, b: &Value, f: impl Fn(f64, f64) -> f64) -> Result<Vec<f64>> {
    if a.shape != b.shape {
        return Err(Error::Invalid(format!(
            "elementwise operands {:?} and {:?} differ",
            a.shape, b.shape
        )));
    }
    Ok(a.data.iter().zip(&b.data).map(|(&x, &y)| f(x, y)).collect())
}

/// `cond ? a : b` elementwise.
fn select(cond: &Value, a: &Value, b: &Value) -> Result<Vec<f64>> {
    if cond.shape != a.shape || a.shape != b.shape {
        return Err(Error::Invalid(format!(
            "where operands {:?}, {:?}, {:?} differ",
            cond.shape, a.shape, b.shape
        )));
    }
    Ok((0..a.data.len())
        .map(|i| if cond.data[i] != 0.0 { a.data[i] } else { b.data[i] })
        .collect())
}

// ---- reductions along one axis ----

/// `(outer, n, inner)` around `axis`: element `(o, j, i)` sits at `(o·n + j)·inner + i`.
fn around(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (numel(&shape[..axis]), shape[axis], numel(&shape[axis + 1..]))
}

/// The values along `axis`, one lane per `(outer, inner)` position, in row-major order of those.
fn lanes(x: &Value, axis: usize) -> Vec<Vec<f64>> {
    let (outer, n, inner) = around(&x.shape, axis);
    let mut lanes = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            lanes.push((0..n).map(|j| x.data[(o * n + j) * inner + i]).collect());
        }
    }
    lanes
}

fn last_axis_lanes(x: &Value) -> Vec<Vec<f64>> {
    lanes(x, x.shape.len() - 1)
}

/// `x` with every lane along `axis` replaced by `f(lane)` (of the same length).
fn map_lanes(x: &Value, axis: usize, f: impl Fn(&[f64]) -> Vec<f64>) -> Vec<f64> {
    let (_, n, inner) = around(&x.shape, axis);
    let mut out = vec![0.0; x.data.len()];
    for (l, lane) in lanes(x, axis).iter().enumerate() {
        let (o, i) = (l / inner, l % inner);
        for (j, v) in f(lane).into_iter().enumerate() {
            out[(o * n + j) * inner + i] = v;
        }
    }
    out
}

fn reduce(op: ReduceOp, lane: &[f64]) -> f64 {
    match op {
        ReduceOp::Sum => lane.iter().sum(),
        ReduceOp::Max => max(lane),
        ReduceOp::Min => lane.iter().fold(f64::INFINITY, |m, &v| binary(BinaryOp::Minimum, m, v)),
        ReduceOp::ArgMax => first_argmax(lane) as f64,
        ReduceOp::LogSumExp => {
            let m = max(lane);
            if m.is_infinite() {
                m
            } else {
                m + lane.iter().map(|&v| (v - m).exp()).sum::<f64>().ln()
            }
        }
    }
}

fn max(lane: &[f64]) -> f64 {
    lane.iter()
        .fold(f64::NEG_INFINITY, |m, &v| binary(BinaryOp::Maximum, m, v))
}

/// Index of the first maximum (later equal values do not replace it).
fn first_argmax(lane: &[f64]) -> usize {
    let mut best = 0;
    for (j, &v) in lane.iter().enumerate() {
        if v > lane[best] {
            best = j;
        }
    }
    best
}

fn softmax(lane: &[f64]) -> Vec<f64> {
    let m = max(lane);
    let exps: Vec<f64> = lane.iter().map(|&v| (v - m).exp()).collect();
    let total: f64 = exps.iter().sum();
    exps.iter().map(|e| e / total).collect()
}

/// Inclusive prefix sums, from the end with `reverse`.
fn cumsum(lane: &[f64], reverse: bool) -> Vec<f64> {
    let mut out = vec![0.0; lane.len()];
    let mut running = 0.0;
    let order: Vec<usize> = if reverse {
        (0..lane.len()).rev().collect()
    } else {
        (0..lane.len()).collect()
    };
    for j in order {
        running += lane[j];
        out[j] = running;
    }
    out
}

// ---- linear algebra ----

/// Row `r` of a row-major matrix with rows of `len`.
fn row(data: &[f64], r: usize, len: usize) -> &[f64] {
    &data[r * len..(r + 1) * len]
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `a [.., M, K] @ b [.., K, N]`, or `b [.., N, K]` with `transpose_b`; `b` of rank 2 is shared,
/// otherwise it has `a`'s batch axes (the builder broadcast them).
fn matmul(a: &Value, b: &Value, transpose_b: bool) -> Result<Vec<f64>> {
    let (ra, rb) = (a.shape.len(), b.shape.len());
    let (m, k) = (a.shape[ra - 2], a.shape[ra - 1]);
    let n = if transpose_b { b.shape[rb - 2] } else { b.shape[rb - 1] };
    let shared_b = rb == 2;
    if !shared_b && b.shape[..rb - 2] != a.shape[..ra - 2] {
        return Err(Error::Invalid(format!(
            "matmul batch axes of {:?} and {:?} differ",
            a.shape, b.shape
        )));
    }
    let batch = numel(&a.shape[..ra - 2]);
    let mut out = Vec::with_capacity(batch * m * n);
    for p in 0..batch {
        let b0 = if shared_b { 0 } else { p * k * n };
        for i in 0..m {
            let a_row = row(&a.data, p * m + i, k);
            for j in 0..n {
                let b_at = |l: usize| {
                    if transpose_b {
                        b.data[b0 + j * k + l]
                    } else {
                        b.data[b0 + l * n + j]
                    }
                };
                out.push((0..k).map(|l| a_row[l] * b_at(l)).sum());
            }
        }
    }
    Ok(out)
}

/// Row `r` of a packed `[rows, K·bits/32]` weight (any leading axes flattened into `rows`) with
/// scales and biases `[rows, K/g]`, dequantized to `[K]`: `q · scale + bias` per group.
fn dequant_row(packed: [&Value; 3], r: usize, bits: u32, group: usize) -> Vec<f64> {
    let [w, scales, biases] = packed;
    let words = *w.shape.last().unwrap_or(&0);
    let k = words * (32 / bits as usize);
    let groups = k / group;
    let row_words: Vec<u32> = row(&w.data, r, words).iter().map(|&v| v as u32).collect();
    (0..k)
        .map(|j| {
            let g = r * groups + j / group;
            unpack(&row_words, j, bits) as f64 * scales.data[g] + biases.data[g]
        })
        .collect()
}

/// `x [.., K] @ dequant(w)ᵀ` for `w` packed `[N, K·bits/32]`: out `[.., N]`.
fn quantized_matmul(x: &Value, packed: [&Value; 3], bits: u32, group: usize) -> Vec<f64> {
    let n = packed[0].shape[0];
    let k = *x.shape.last().unwrap_or(&0);
    let w: Vec<Vec<f64>> = (0..n).map(|r| dequant_row(packed, r, bits, group)).collect();
    let rows = numel(&x.shape[..x.shape.len() - 1]);
    let mut out = Vec::with_capacity(rows * n);
    for r in 0..rows {
        let x_row = row(&x.data, r, k);
        out.extend(w.iter().map(|w_row| dot(x_row, w_row)));
    }
    out
}

/// MoE: `x [.., X, K]` (X is 1 or `top`) times expert `ids [.., top]` of `w [E, N, K·bits/32]`;
/// out `[.., top, N]`.
fn gather_qmm(x: &Value, packed: [&Value; 3], ids: &Value, bits: u32, group: usize) -> Result<Vec<f64>> {
    let (experts, n) = (packed[0].shape[0], packed[0].shape[1]);
    let rx = x.shape.len();
    let (x_rows, k) = (x.shape[rx - 2], x.shape[rx - 1]);
    let top = *ids.shape.last().unwrap_or(&0);
    let batch = numel(&ids.shape[..ids.shape.len() - 1]);
    let mut out = Vec::with_capacity(batch * top * n);
    for p in 0..batch {
        for i in 0..top {
            let e = checked_index(ids.data[p * top + i], experts, "gather_qmm: expert id")?;
            let x_row = row(&x.data, p * x_rows + if x_rows == 1 { 0 } else { i }, k);
            for c in 0..n {
                out.push(dot(x_row, &dequant_row(packed, e * n + c, bits, group)));
            }
        }
    }
    Ok(out)
}

/// Rows of a packed table `[V, D·bits/32]` at `ids [..]`, dequantized: out `[.., D]`.
fn quantized_gather(packed: [&Value; 3], ids: &Value, bits: u32, group: usize) -> Result<Vec<f64>> {
    let mut out = Vec::new();
    for &id in &ids.data {
        let r = checked_index(id, packed[0].shape[0], "quantized_gather: id")?;
        out.extend(dequant_row(packed, r, bits, group));
    }
    Ok(out)
}

// ---- fused NN ops ----

/// `x [.., D] · rsqrt(mean(x²) + eps) · w [D]` (or `· (1 + w)`) per row.
fn rms_norm(x: &Value, w: &Value, eps: f64, unit_offset: bool) -> Vec<f64> {
    let d = w.data.len();
    let rows = numel(&x.shape[..x.shape.len() - 1]);
    let mut out = Vec::with_capacity(x.data.len());
    for r in 0..rows {
        let xs = row(&x.data, r, d);
        let inv = 1.0 / (xs.iter().map(|v| v * v).sum::<f64>() / d as f64 + eps).sqrt();
        for (&v, &g) in xs.iter().zip(&w.data) {
            out.push(v * inv * if unit_offset { 1.0 + g } else { g });
        }
    }
    out
}

/// `(x - mean) / sqrt(var + eps) · w + b` over the last axis (biased variance).
fn layer_norm(x: &Value, weight: Option<&Value>, bias: Option<&Value>, eps: f64) -> Vec<f64> {
    let d = *x.shape.last().unwrap_or(&0);
    let rows = numel(&x.shape[..x.shape.len() - 1]);
    let mut out = Vec::with_capacity(x.data.len());
    for r in 0..rows {
        let xs = row(&x.data, r, d);
        let mean = xs.iter().sum::<f64>() / d as f64;
        let var = xs.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / d as f64;
        for (c, &v) in xs.iter().enumerate() {
            let normed = (v - mean) / (var + eps).sqrt();
            out.push(normed * weight.map_or(1.0, |w| w.data[c]) + bias.map_or(0.0, |b| b.data[c]));
        }
    }
    out
}

/// Rotary embedding of `x [B, H, T, D]` at `positions [T]` or `[B, T]` with `inv_freq [dims/2]`.
fn rope(x: &Value, positions: &Value, inv_freq: &Value, dims: usize, interleaved: bool, scale: f64) -> Vec<f64> {
    let (b, h, t, d) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let half = dims / 2;
    let mut out = x.data.clone(); // channels past `dims` pass through
    for bi in 0..b {
        for hi in 0..h {
            for ti in 0..t {
                let pos = if positions.shape.len() == 1 {
                    positions.data[ti]
                } else {
                    positions.data[bi * t + ti]
                };
                let base = ((bi * h + hi) * t + ti) * d;
                for i in 0..half {
                    let angle = pos * scale * inv_freq.data[i];
                    let (ia, ib) = if interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
                    let (xa, xb) = (x.data[base + ia], x.data[base + ib]);
                    out[base + ia] = xa * angle.cos() - xb * angle.sin();
                    out[base + ib] = xa * angle.sin() + xb * angle.cos();
                }
            }
        }
    }
    out
}

#[derive(Clone, Copy)]
struct Mask {
    causal: bool,
    window: Option<usize>,
}

impl Mask {
    /// Whether the query at position `p` sees key `j` (one of the first `kv_len`).
    fn sees(self, p: usize, j: usize) -> bool {
        let (p, j) = (p as i64, j as i64);
        (!self.causal || j <= p) && self.window.is_none_or(|w| j > p - w as i64)
    }
}

/// The entry of a per-batch runtime value (`[]` or `[B]`) for batch `b`.
fn per_batch(v: &Value, b: usize) -> f64 {
    if v.data.len() == 1 {
        v.data[0]
    } else {
        v.data[b]
    }
}

/// `q [B, Hq, T, D]` over the first `kv_len` of `k [B, Hkv, S, D]`, `v [B, Hkv, S, Dv]`; query
/// `t` sits at position `kv_len - T + t`, and head `h` reads kv head `h / (Hq / Hkv)`.
fn attention(qkv: [&Value; 3], kv_len: &Value, scale: f64, mask: Mask, softcap: Option<f64>) -> Result<Vec<f64>> {
    let k = qkv[1];
    let (hkv, cap) = (k.shape[1], k.shape[2]);
    let rows = |bi: usize, kvh: usize, j: usize| Ok((bi * hkv + kvh) * cap + j);
    attend(qkv, kv_len, hkv, cap, rows, scale, mask, softcap)
}

/// [`attention`] over a paged pool `k [P, Hkv, D]`, `v [P, Hkv, Dv]`: row `b`'s position `j` at
/// slot `table[b, j / bs] · bs + j % bs`.
fn paged_attention(
    qkv: [&Value; 3],
    kv_len: &Value,
    table: &Value,
    bs: usize,
    scale: f64,
    mask: Mask,
    softcap: Option<f64>,
) -> Result<Vec<f64>> {
    let k = qkv[1];
    let (slots, hkv, width) = (k.shape[0], k.shape[1], table.shape[1]);
    let rows = |bi: usize, kvh: usize, j: usize| {
        let block = checked_index(table.data[bi * width + j / bs], slots / bs, "paged_attention: block")?;
        Ok((block * bs + j % bs) * hkv + kvh)
    };
    attend(qkv, kv_len, hkv, width * bs, rows, scale, mask, softcap)
}

/// The attention both layouts share: `rows(b, kv head, j)` is the row of k (D wide) and v (Dv
/// wide) that holds position `j`, of `cap` positions a row.
#[allow(clippy::too_many_arguments)]
fn attend(
    qkv: [&Value; 3],
    kv_len: &Value,
    hkv: usize,
    cap: usize,
    rows: impl Fn(usize, usize, usize) -> Result<usize>,
    scale: f64,
    mask: Mask,
    softcap: Option<f64>,
) -> Result<Vec<f64>> {
    let [q, k, v] = qkv;
    let (b, hq, t, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
    let dv = *v.shape.last().unwrap_or(&0);
    let mut out = Vec::with_capacity(b * hq * t * dv);
    for bi in 0..b {
        let len = per_batch(kv_len, bi);
        if !(len >= t as f64 && len <= cap as f64) {
            return Err(Error::Runtime(format!(
                "attention: kv_len {len} must cover the {t} queries and fit the {cap} cache slots"
            )));
        }
        let len = len as usize;
        for h in 0..hq {
            let kv_row: Vec<usize> = (0..len).map(|j| rows(bi, h / (hq / hkv), j)).collect::<Result<_>>()?;
            let kv_row = |j: usize| kv_row[j];
            for ti in 0..t {
                let p = len - t + ti;
                let q_row = row(&q.data, (bi * hq + h) * t + ti, d);
                let keys: Vec<usize> = (0..len).filter(|&j| mask.sees(p, j)).collect();
                let scores: Vec<f64> = keys
                    .iter()
                    .map(|&j| {
                        let s = dot(q_row, row(&k.data, kv_row(j), d)) * scale;
                        softcap.map_or(s, |c| c * (s / c).tanh())
                    })
                    .collect();
                let weights = softmax(&scores);
                for c in 0..dv {
                    out.push(
                        keys.iter()
                            .zip(&weights)
                            .map(|(&j, w)| w * v.data[kv_row(j) * dv + c])
                            .sum(),
                    );
                }
            }
        }
    }
    Ok(out)
}

/// `cache [B, H, S, D]` with `new [B, H, T, D]` written at slots `pos..pos + T` (`pos` `[]` or `[B]`).
fn kv_write(cache: &Value, new: &Value, pos: &Value) -> Result<Vec<f64>> {
    let (b, h, cap, d) = (cache.shape[0], cache.shape[1], cache.shape[2], cache.shape[3]);
    let t = new.shape[2];
    let per_token = pos.shape.len() == 2;
    let mut out = cache.data.clone();
    for bi in 0..b {
        for ti in 0..t {
            // Token ti's slot: its own, or the row's position plus ti.
            let p = if per_token {
                pos.data[bi * t + ti]
            } else {
                per_batch(pos, bi) + ti as f64
            };
            if !(p >= 0.0 && p < cap as f64) {
                return Err(Error::Runtime(format!(
                    "kv_write: entry {ti} at position {p} overflows a cache of {cap}"
                )));
            }
            for hi in 0..h {
                let src = ((bi * h + hi) * t + ti) * d;
                let dst = ((bi * h + hi) * cap + p as usize) * d;
                out[dst..dst + d].copy_from_slice(&new.data[src..src + d]);
            }
        }
    }
    Ok(out)
}

/// A runtime index checked against `0..len`.
fn checked_index(v: f64, len: usize, what: &str) -> Result<usize> {
    if v >= 0.0 && v < len as f64 {
        Ok(v as usize)
    } else {
        Err(Error::Runtime(format!("{what} {v} is out of range 0..{len}")))
    }
}

/// Rows of `table [V, D]` at `ids [..]`: out `[.., D]`.
fn gather(table: &Value, ids: &Value) -> Result<Vec<f64>> {
    let (v, d) = (table.shape[0], table.shape[1]);
    let mut out = Vec::with_capacity(ids.data.len() * d);
    for &id in &ids.data {
        out.extend_from_slice(row(&table.data, checked_index(id, v, "gather: id")?, d));
    }
    Ok(out)
}

/// `out[o, j, i] = x[o, idx[o, j, i], i]` around `axis`; out has `idx`'s shape.
fn take_along_axis(x: &Value, idx: &Value, axis: usize) -> Result<Vec<f64>> {
    let (outer, nx, inner) = around(&x.shape, axis);
    let ni = idx.shape[axis];
    let mut out = Vec::with_capacity(idx.data.len());
    for o in 0..outer {
        for j in 0..ni {
            for i in 0..inner {
                let at = checked_index(idx.data[(o * ni + j) * inner + i], nx, "take_along_axis: index")?;
                out.push(x.data[(o * nx + at) * inner + i]);
            }
        }
    }
    Ok(out)
}

// ---- layout ----

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for a in (0..shape.len().saturating_sub(1)).rev() {
        s[a] = s[a + 1] * shape[a + 1];
    }
    s
}

/// The multi-index of flat position `f` in `shape`.
fn unravel(mut f: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for a in (0..shape.len()).rev() {
        idx[a] = f % shape[a];
        f /= shape[a];
    }
    idx
}

/// Each output element from the input element at `src(output multi-index)`.
fn gather_by_index(x: &Value, out_shape: &[usize], src: impl Fn(&[usize]) -> Vec<usize>) -> Vec<f64> {
    let s = strides(&x.shape);
    (0..numel(out_shape))
        .map(|f| {
            let from = src(&unravel(f, out_shape));
            x.data[from.iter().zip(&s).map(|(i, st)| i * st).sum::<usize>()]
        })
        .collect()
}

/// Output axis `a` is input axis `perm[a]`.
fn transpose(x: &Value, perm: &[usize], out_shape: &[usize]) -> Vec<f64> {
    gather_by_index(x, out_shape, |idx| {
        let mut from = vec![0; idx.len()];
        for (a, &p) in perm.iter().enumerate() {
            from[p] = idx[a];
        }
        from
    })
}

fn slice(x: &Value, start: &[usize], step: &[usize], out_shape: &[usize]) -> Vec<f64> {
    gather_by_index(x, out_shape, |idx| {
        (0..idx.len()).map(|a| start[a] + idx[a] * step[a]).collect()
    })
}

/// Size-1 axes of `x` stretch to `out_shape` (same rank).
fn broadcast(x: &Value, out_shape: &[usize]) -> Vec<f64> {
    gather_by_index(x, out_shape, |idx| {
        (0..idx.len())
            .map(|a| if x.shape[a] == 1 { 0 } else { idx[a] })
            .collect()
    })
}

fn concat(parts: &[&Value], axis: usize) -> Vec<f64> {
    let outer = numel(&parts[0].shape[..axis]);
    let mut out = Vec::new();
    for o in 0..outer {
        for p in parts {
            let slab = numel(&p.shape[axis..]); // one outer index's worth of this part
            out.extend_from_slice(&p.data[o * slab..(o + 1) * slab]);
        }
    }
    out
}

// ---- sorting and sampling ----

/// Numbers in their order, NaN above all of them (so the order is total).
fn order(a: f64, b: f64) -> Ordering {
    a.partial_cmp(&b).unwrap_or_else(|| a.is_nan().cmp(&b.is_nan()))
}

/// Positions of `lane` sorted by value; the sort is stable, so equal values keep the lower index
/// first in both directions.
fn sorted_indices(lane: &[f64], descending: bool) -> impl Iterator<Item = f64> {
    let mut idx: Vec<usize> = (0..lane.len()).collect();
    idx.sort_by(|&i, &j| {
        if descending {
            order(lane[j], lane[i])
        } else {
            order(lane[i], lane[j])
        }
    });
    idx.into_iter().map(|i| i as f64)
}

/// Per row of `logits [B, V]`: `argmax_v logits[b, v] + gumbel(seed, counter, b, v)`.
fn sample_categorical(logits: &Value, counter: &Value, seed: u64) -> Vec<f64> {
    let (b, v) = (logits.shape[0], logits.shape[1]);
    let counter = counter.data[0] as u32;
    (0..b)
        .map(|r| {
            let noisy: Vec<f64> = (0..v)
                .map(|c| logits.data[r * v + c] + gumbel(seed, counter, r as u32, c as u32) as f64)
                .collect();
            first_argmax(&noisy) as f64
        })
        .collect()
}

#[cfg(test)]
mod tests {
    //! The oracle checked against numbers derived by hand, not by the code.

    use std::f32::consts::{FRAC_PI_2, PI as PI32};

    use super::*;
    use crate::graph::NodeId;
    use crate::GraphBuilder;

    fn tensor(dtype: DType, shape: &[usize], values: &[f32]) -> HostTensor {
        HostTensor::from_f32(dtype, shape, values).unwrap()
    }

    /// Evaluates the single output `out` of `b` with no initial states.
    fn eval1(b: GraphBuilder, out: NodeId, inputs: &[HostTensor]) -> Vec<f64> {
        evaluate(&b.finish(&[out]), inputs, &[]).unwrap()[0].to_f64_vec()
    }

    fn assert_close(got: &[f64], want: &[f64], tol: f64) {
        assert_eq!(got.len(), want.len(), "got {got:?}, want {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= tol, "got {got:?}, want {want:?}");
        }
    }

    #[test]
    fn softmax_of_zero_and_ln3_is_a_quarter_and_three_quarters() {
        let mut b = GraphBuilder::default();
        let x = b.constant(tensor(DType::F32, &[2], &[0.0, 3f32.ln()]));
        let y = b.softmax(x, -1).unwrap();
        assert_close(&eval1(b, y, &[]), &[0.25, 0.75], 1e-7);
    }

    #[test]
    fn logsumexp_of_zero_and_ln3_is_ln4() {
        let mut b = GraphBuilder::default();
        let x = b.constant(tensor(DType::F32, &[2], &[0.0, 3f32.ln()]));
        let y = b.reduce(ReduceOp::LogSumExp, x, 0, false).unwrap();
        assert_close(&eval1(b, y, &[]), &[4f64.ln()], 1e-6);
    }

    #[test]
    fn reductions_along_a_middle_axis_with_and_without_keepdims() {
        // x[i, j, k] = 4i + 2j + k over [2, 2, 2]; summing j gives 8i + 2 + 2k.
        let values: Vec<f32> = (0..8).map(|v| v as f32).collect();
        for keepdims in [false, true] {
            let mut b = GraphBuilder::default();
            let x = b.constant(tensor(DType::F32, &[2, 2, 2], &values));
            let y = b.sum(x, 1, keepdims).unwrap();
            let g = b.finish(&[y]);
            let out = &evaluate(&g, &[], &[]).unwrap()[0];
            assert_eq!(out.shape, if keepdims { vec![2, 1, 2] } else { vec![2, 2] });
            assert_eq!(out.to_f64_vec(), [2.0, 4.0, 10.0, 12.0]);
        }
    }

    #[test]
    fn argmax_takes_the_first_of_equal_maxima() {
        let mut b = GraphBuilder::default();
        let x = b.constant(tensor(DType::F32, &[2, 4], &[1.0, 5.0, 5.0, 2.0, 7.0, 0.0, 7.0, 7.0]));
        let y = b.argmax(x, -1).unwrap();
        assert_eq!(b.dtype(y), DType::U32);
        assert_eq!(eval1(b, y, &[]), [1.0, 0.0]);
    }

    #[test]
    fn cumsum_is_inclusive_both_ways() {
        for (reverse, want) in [(false, [1.0, 3.0, 6.0]), (true, [6.0, 5.0, 3.0])] {
            let mut b = GraphBuilder::default();
            let x = b.constant(tensor(DType::I32, &[3], &[1.0, 2.0, 3.0]));
            let y = b.cumsum(x, 0, reverse).unwrap();
            assert_eq!(eval1(b, y, &[]), want);
        }
    }

    #[test]
    fn erf_matches_tabulated_values() {
        // Abramowitz and Stegun, table 7.1.
        let table = [
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (3.0, 0.999_977_909_503_001_4),
        ];
        for (x, want) in table {
            assert!((erf(x) - want).abs() < 1e-14, "erf({x}) = {}", erf(x));
            assert!((erf(-x) + want).abs() < 1e-14);
        }
        assert_eq!(erf(0.0), 0.0);
        assert_eq!(erf(7.0), 1.0);
    }

    #[test]
    fn gelu_of_one_is_phi_of_one() {
        // gelu(x) = x Φ(x), and Φ(1) = 0.841344746068543.
        assert!((unary(UnaryOp::GeluErf, 1.0) - 0.841_344_746_068_543).abs() < 1e-14);
        assert_eq!(unary(UnaryOp::GeluErf, 0.0), 0.0);
    }

    #[test]
    fn softcap_of_ln3_with_cap_2_is_1() {
        // tanh(ln 3 / 2) = (3 - 1) / (3 + 1) = 1/2.
        assert!((unary(UnaryOp::Softcap(2.0), 3f64.ln()) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn results_round_to_the_node_dtype() {
        // 1/3 = 1.0101010101|01…b × 2⁻²: f16 keeps 11 bits (rounds down to 0.333251953125),
        // bf16 keeps 8 (1.0101010|1… rounds up to 0.333984375).
        for (dtype, want) in [(DType::F16, 0.333_251_953_125), (DType::BF16, 0.333_984_375)] {
            let mut b = GraphBuilder::default();
            let one = b.input("one", dtype, &[1]);
            let three = b.input("three", dtype, &[1]);
            let y = b.div(one, three).unwrap();
            let inputs = [tensor(dtype, &[1], &[1.0]), tensor(dtype, &[1], &[3.0])];
            assert_eq!(eval1(b, y, &inputs), [want]);
        }
    }

    #[test]
    fn rounding_agrees_with_convert_elements_bit_for_bit() {
        let mut rng = crate::rng::SplitMix64(3);
        let mut values: Vec<f32> = (0..2000)
            .map(|i| rng.next_signed() * [1.0, 300.0, 7e4, 5e9][i % 4])
            .collect();
        values.extend([
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -0.0,
            65520.0,
            1e-8,
            2.5,
            -2.5,
            255.9,
            -1.0,
        ]);
        let src: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        for to in DType::ALL {
            let mut dst = vec![0u8; values.len() * to.size()];
            crate::tensor::convert_elements(DType::F32, &src, to, &mut dst);
            let want = HostTensor::from_bytes(to, vec![values.len()], Storage::from_vec(dst)).unwrap();
            let ours = Value {
                shape: vec![values.len()],
                data: values.iter().map(|&v| round_to(to, v as f64)).collect(),
            };
            assert_eq!(to_host(to, &ours).unwrap().bytes(), want.bytes(), "to {to}");
        }
    }

    #[test]
    fn astype_truncates_toward_zero_and_saturates() {
        let x = [-2.7, 2.7, -1.0, 3e9, f32::NAN];
        for (to, want) in [
            (DType::I32, [-2.0, 2.0, -1.0, i32::MAX as f64, 0.0]),
            (DType::U32, [0.0, 2.0, 0.0, 3e9, 0.0]),
            (DType::Bool, [1.0, 1.0, 1.0, 1.0, 1.0]),
        ] {
            let mut b = GraphBuilder::default();
            let c = b.constant(tensor(DType::F32, &[5], &x));
            let y = b.astype(c, to);
            assert_eq!(eval1(b, y, &[]), want, "to {to}");
        }
    }

    #[test]
    fn matmul_of_two_by_two_matrices() {
        // [[1, 2], [3, 4]] @ [[5, 6], [7, 8]] = [[19, 22], [43, 50]]; @ its transpose:
        // [[1·5 + 2·6, 1·7 + 2·8], [3·5 + 4·6, 3·7 + 4·8]] = [[17, 23], [39, 53]].
        for (transpose, want) in [(false, [19.0, 22.0, 43.0, 50.0]), (true, [17.0, 23.0, 39.0, 53.0])] {
            let mut b = GraphBuilder::default();
            let x = b.input("x", DType::F32, &[2, 2]);
            let w = b.parameter("w", tensor(DType::F32, &[2, 2], &[5.0, 6.0, 7.0, 8.0]));
            let y = if transpose {
                b.matmul_t(x, w).unwrap()
            } else {
                b.matmul(x, w).unwrap()
            };
            assert_eq!(eval1(b, y, &[tensor(DType::F32, &[2, 2], &[1.0, 2.0, 3.0, 4.0])]), want);
        }
    }

    #[test]
    fn matmul_with_batched_b_pairs_batches() {
        // Batch 0: [1, 1] @ I = [1, 1]; batch 1: [1, 1] @ 2I = [2, 2].
        let mut b = GraphBuilder::default();
        let x = b.input("x", DType::F32, &[2, 1, 2]);
        let w = b.input("w", DType::F32, &[2, 2, 2]);
        let y = b.matmul(x, w).unwrap();
        let inputs = [
            tensor(DType::F32, &[2, 1, 2], &[1.0; 4]),
            tensor(DType::F32, &[2, 2, 2], &[1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 2.0]),
        ];
        assert_eq!(eval1(b, y, &inputs), [1.0, 1.0, 2.0, 2.0]);
    }

    /// One 4-bit row of K = 32: word 0 holds q₀ = 1 and q₁ = 2 (low nibbles first), all other
    /// elements are 0; scale 0.5 and bias -1 make the row [-0.5, 0, -1, -1, …].
    fn hand_packed_row(b: &mut GraphBuilder, rows: usize) -> [NodeId; 3] {
        let mut words = vec![0u32; 4 * rows];
        for r in 0..rows {
            words[4 * r] = 0x21;
        }
        let w = b.parameter("w", HostTensor::from_slice(&[rows, 4], &words).unwrap());
        let s = b.parameter("s", tensor(DType::F32, &[rows, 1], &vec![0.5; rows]));
        let z = b.parameter("z", tensor(DType::F32, &[rows, 1], &vec![-1.0; rows]));
        [w, s, z]
    }

    #[test]
    fn quantized_matmul_on_a_hand_packed_word() {
        // x = [1, 1, 0, …, 0, 2]: 1·(-0.5) + 1·0 + 2·(-1) = -2.5.
        let mut b = GraphBuilder::default();
        let [w, s, z] = hand_packed_row(&mut b, 1);
        let x = b.input("x", DType::F32, &[1, 32]);
        let y = b.quantized_matmul(x, w, s, z, 4, 32).unwrap();
        let mut xs = vec![0.0; 32];
        xs[0] = 1.0;
        xs[1] = 1.0;
        xs[31] = 2.0;
        assert_eq!(eval1(b, y, &[tensor(DType::F32, &[1, 32], &xs)]), [-2.5]);
    }

    #[test]
    fn quantized_gather_dequantizes_the_row() {
        let mut b = GraphBuilder::default();
        let [w, s, z] = hand_packed_row(&mut b, 2);
        let ids = b.constant(tensor(DType::U32, &[1], &[1.0]));
        let y = b.quantized_gather(w, s, z, ids, 4, 32).unwrap();
        let mut want = vec![-1.0; 32];
        want[0] = -0.5;
        want[1] = 0.0;
        assert_eq!(eval1(b, y, &[]), want);
    }

    #[test]
    fn gather_qmm_picks_each_tokens_experts() {
        // All q = 0; expert e has bias e + 1, so its row is all e + 1 and x = ones (K = 32)
        // gives 32 (e + 1). Ids [1, 0] → [64, 32].
        let mut b = GraphBuilder::default();
        let w = b.parameter("w", HostTensor::from_slice(&[2, 1, 4], &[0u32; 8]).unwrap());
        let s = b.parameter("s", tensor(DType::F32, &[2, 1, 1], &[1.0, 1.0]));
        let z = b.parameter("z", tensor(DType::F32, &[2, 1, 1], &[1.0, 2.0]));
        let x = b.constant(tensor(DType::F32, &[1, 32], &[1.0; 32]));
        let ids = b.constant(tensor(DType::U32, &[2], &[1.0, 0.0]));
        let y = b.gather_qmm(x, w, s, z, ids, 4, 32).unwrap();
        assert_eq!(b.shape(y), [2, 1]);
        assert_eq!(eval1(b, y, &[]), [64.0, 32.0]);
    }

    #[test]
    fn rms_norm_of_plus_minus_two_is_plus_minus_one() {
        // mean(x²) = 4, so x / 2; with unit_offset and w = 1 the scale is 2.
        for (unit_offset, k) in [(false, 1.0), (true, 2.0)] {
            let mut b = GraphBuilder::default();
            let x = b.constant(tensor(DType::F32, &[4], &[2.0, -2.0, 2.0, -2.0]));
            let w = b.parameter("w", tensor(DType::F32, &[4], &[1.0; 4]));
            let y = b.rms_norm(x, w, 0.0, unit_offset).unwrap();
            assert_eq!(eval1(b, y, &[]), [k, -k, k, -k]);
        }
    }

    #[test]
    fn layer_norm_of_one_two_three() {
        // mean 2, variance 2/3: (x - 2) · √(3/2); then · w + b with w = 2, b = 1.
        let r = 1.5f64.sqrt();
        let mut b = GraphBuilder::default();
        let x = b.constant(tensor(DType::F32, &[3], &[1.0, 2.0, 3.0]));
        let w = b.parameter("w", tensor(DType::F32, &[3], &[2.0; 3]));
        let bias = b.parameter("b", tensor(DType::F32, &[3], &[1.0; 3]));
        let plain = b.layer_norm(x, None, None, 0.0).unwrap();
        let affine = b.layer_norm(x, Some(w), Some(bias), 0.0).unwrap();
        let only_bias = b.layer_norm(x, None, Some(bias), 0.0).unwrap();
        let out = evaluate(&b.finish(&[plain, affine, only_bias]), &[], &[]).unwrap();
        assert_close(&out[0].to_f64_vec(), &[-r, 0.0, r], 1e-6);
        assert_close(&out[1].to_f64_vec(), &[1.0 - 2.0 * r, 1.0, 1.0 + 2.0 * r], 1e-6);
        assert_close(&out[2].to_f64_vec(), &[1.0 - r, 1.0, 1.0 + r], 1e-6);
    }

    /// Rope of x = [1, 2, 3, 4] (one head, one token) at `position` with inv_freq [π/2, π][..dims/2].
    fn rope_of_1234(dims: usize, interleaved: bool, positions: HostTensor, scale: f32, batch: usize) -> Vec<f64> {
        let mut b = GraphBuilder::default();
        let x = b.constant(tensor(
            DType::F32,
            &[batch, 1, 1, 4],
            &[1.0, 2.0, 3.0, 4.0].repeat(batch),
        ));
        let p = b.input("positions", positions.dtype, &positions.shape);
        let f = b.constant(tensor(DType::F32, &[dims / 2], &[FRAC_PI_2, PI32][..dims / 2]));
        let y = b.rope(x, p, f, dims, interleaved, scale).unwrap();
        eval1(b, y, &[positions])
    }

    #[test]
    fn rope_rotates_pairs_by_quarter_and_half_turns() {
        let at_one = || tensor(DType::I32, &[1], &[1.0]);
        // Interleaved pairs (1, 2) by 90° → (-2, 1); (3, 4) by 180° → (-3, -4).
        assert_close(&rope_of_1234(4, true, at_one(), 1.0, 1), &[-2.0, 1.0, -3.0, -4.0], 1e-6);
        // Half-split pairs (x0, x2) = (1, 3) by 90° → (-3, 1); (x1, x3) = (2, 4) by 180° → (-2, -4).
        assert_close(
            &rope_of_1234(4, false, at_one(), 1.0, 1),
            &[-3.0, -2.0, 1.0, -4.0],
            1e-6,
        );
        // dims 2 < D: pair (1, 2) by 90°, channels 2 and 3 pass through.
        assert_close(&rope_of_1234(2, false, at_one(), 1.0, 1), &[-2.0, 1.0, 3.0, 4.0], 1e-6);
        // Position 2 at scale 1/2 is the same angle.
        let at_two = tensor(DType::I32, &[1], &[2.0]);
        assert_close(&rope_of_1234(2, true, at_two, 0.5, 1), &[-2.0, 1.0, 3.0, 4.0], 1e-6);
        // Positions [B, T]: row 0 at position 0 is unchanged, row 1 at position 1 rotates.
        let per_row = tensor(DType::I32, &[2, 1], &[0.0, 1.0]);
        assert_close(
            &rope_of_1234(2, false, per_row, 1.0, 2),
            &[1.0, 2.0, 3.0, 4.0, -2.0, 1.0, 3.0, 4.0],
            1e-6,
        );
    }

    /// Attention of `q` over keys/values laid out `[1, heads, S, D]` with the given kv_len.
    fn attend(
        q: (&[usize], &[f32]),
        k: (&[usize], &[f32]),
        v: (&[usize], &[f32]),
        kv_len: i32,
        mask: Mask,
    ) -> Result<Vec<f64>> {
        attend_capped(q, k, v, kv_len, mask, None)
    }

    fn attend_capped(
        q: (&[usize], &[f32]),
        k: (&[usize], &[f32]),
        v: (&[usize], &[f32]),
        kv_len: i32,
        mask: Mask,
        softcap: Option<f32>,
    ) -> Result<Vec<f64>> {
        let mut b = GraphBuilder::default();
        let q = b.constant(tensor(DType::F32, q.0, q.1));
        let k = b.constant(tensor(DType::F32, k.0, k.1));
        let v = b.constant(tensor(DType::F32, v.0, v.1));
        let len = b.input("kv_len", DType::I32, &[]);
        let y = b
            .attention(q, k, v, len, 1.0, mask.causal, mask.window, softcap)
            .unwrap();
        let out = evaluate(&b.finish(&[y]), &[tensor(DType::I32, &[], &[kv_len as f32])], &[])?;
        Ok(out[0].to_f64_vec())
    }

    const FULL: Mask = Mask {
        causal: false,
        window: None,
    };
    const CAUSAL: Mask = Mask {
        causal: true,
        window: None,
    };

    #[test]
    fn attention_with_one_key_returns_its_value() {
        let out = attend(
            (&[1, 1, 1, 2], &[0.3, -0.7]),
            (&[1, 1, 1, 2], &[5.0, 1.0]),
            (&[1, 1, 1, 3], &[1.0, 2.0, 3.0]),
            1,
            CAUSAL,
        );
        assert_close(&out.unwrap(), &[1.0, 2.0, 3.0], 1e-7);
    }

    #[test]
    fn causal_mask_on_two_by_two() {
        // q = 0 makes all scores equal, so each query averages the values it sees: v = [1, 3].
        let (q, k, v) = (
            (&[1, 1, 2, 1][..], &[0.0, 0.0][..]),
            (&[1, 1, 2, 1][..], &[1.0, 2.0][..]),
            (&[1, 1, 2, 1][..], &[1.0, 3.0][..]),
        );
        assert_close(&attend(q, k, v, 2, CAUSAL).unwrap(), &[1.0, 2.0], 1e-7);
        assert_close(&attend(q, k, v, 2, FULL).unwrap(), &[2.0, 2.0], 1e-7);
    }

    #[test]
    fn only_the_first_kv_len_keys_count() {
        // One query at position 1 with capacity 3: the third slot (value 100) is ignored.
        let zeros = [0.0; 3];
        let out = attend(
            (&[1, 1, 1, 1], &[0.0]),
            (&[1, 1, 3, 1], &zeros),
            (&[1, 1, 3, 1], &[1.0, 3.0, 100.0]),
            2,
            FULL,
        );
        assert_close(&out.unwrap(), &[2.0], 1e-7);
    }

    #[test]
    fn a_window_of_two_sees_the_last_two_keys() {
        // The query sits at position 2; keys j > 2 - 2 are 1 and 2: mean of 3 and 5.
        let zeros = [0.0; 3];
        let mask = Mask {
            causal: true,
            window: Some(2),
        };
        let out = attend(
            (&[1, 1, 1, 1], &[0.0]),
            (&[1, 1, 3, 1], &zeros),
            (&[1, 1, 3, 1], &[1.0, 3.0, 5.0]),
            3,
            mask,
        );
        assert_close(&out.unwrap(), &[4.0], 1e-7);
    }

    #[test]
    fn softcap_bounds_scores_before_softmax() {
        // Scores [0, ln 3] capped at 2 become [0, 1] (see softcap_of_ln3…): weights
        // [1, e] / (1 + e), and v = [0, 1] gives e / (1 + e).
        let e = std::f64::consts::E;
        let out = attend_capped(
            (&[1, 1, 1, 1], &[3f32.ln()]),
            (&[1, 1, 2, 1], &[0.0, 1.0]),
            (&[1, 1, 2, 1], &[0.0, 1.0]),
            2,
            FULL,
            Some(2.0),
        );
        assert_close(&out.unwrap(), &[e / (1.0 + e)], 1e-6);
    }

    #[test]
    fn query_heads_share_kv_heads_in_groups() {
        // Hq = 4 over Hkv = 2, one key each: heads 0, 1 read kv head 0 (value 10), heads 2, 3 kv head 1.
        let out = attend(
            (&[1, 4, 1, 1], &[0.0; 4]),
            (&[1, 2, 1, 1], &[0.0; 2]),
            (&[1, 2, 1, 1], &[10.0, 20.0]),
            1,
            CAUSAL,
        );
        assert_close(&out.unwrap(), &[10.0, 10.0, 20.0, 20.0], 1e-7);
    }

    #[test]
    fn attention_rejects_kv_len_outside_queries_to_capacity() {
        let (q, k, v) = (
            (&[1, 1, 2, 1][..], &[0.0; 2][..]),
            (&[1, 1, 3, 1][..], &[0.0; 3][..]),
            (&[1, 1, 3, 1][..], &[0.0; 3][..]),
        );
        for bad in [1, 4, -1] {
            assert!(
                matches!(attend(q, k, v, bad, CAUSAL), Err(Error::Runtime(_))),
                "kv_len {bad}"
            );
        }
        assert!(attend(q, k, v, 3, CAUSAL).is_ok());
    }

    #[test]
    fn kv_write_updates_a_given_state_and_unlisted_states_start_at_zero() {
        let mut b = GraphBuilder::default();
        let cache = b.state("k", DType::F32, &[1, 1, 3, 1]);
        let other = b.state("v", DType::F32, &[1, 1, 3, 1]);
        let new = b.input("new", DType::F32, &[1, 1, 1, 1]);
        let pos = b.input("pos", DType::I32, &[]);
        let k = b.kv_write(cache, new, pos).unwrap();
        let v = b.kv_write(other, new, pos).unwrap();
        let g = b.finish(&[k, v, cache]);
        let inputs = [
            tensor(DType::F32, &[1, 1, 1, 1], &[9.0]),
            tensor(DType::I32, &[], &[1.0]),
        ];
        let states = [("k".to_string(), tensor(DType::F32, &[1, 1, 3, 1], &[1.0, 2.0, 3.0]))];
        let out = evaluate(&g, &inputs, &states).unwrap();
        assert_eq!(out[0].to_f64_vec(), [1.0, 9.0, 3.0]);
        assert_eq!(out[1].to_f64_vec(), [0.0, 9.0, 0.0]);
        assert_eq!(
            out[2].to_f64_vec(),
            [1.0, 2.0, 3.0],
            "the state node itself is the value before writes"
        );
    }

    #[test]
    fn kv_write_past_the_end_is_a_runtime_error() {
        let mut b = GraphBuilder::default();
        let cache = b.state("k", DType::F32, &[1, 1, 3, 1]);
        let new = b.input("new", DType::F32, &[1, 1, 2, 1]);
        let pos = b.input("pos", DType::I32, &[]);
        let k = b.kv_write(cache, new, pos).unwrap();
        let g = b.finish(&[k]);
        let run = |p: f32| {
            evaluate(
                &g,
                &[
                    tensor(DType::F32, &[1, 1, 2, 1], &[1.0, 2.0]),
                    tensor(DType::I32, &[], &[p]),
                ],
                &[],
            )
        };
        assert!(run(1.0).is_ok());
        assert!(matches!(run(2.0), Err(Error::Runtime(_))));
        assert!(matches!(run(-1.0), Err(Error::Runtime(_))));
    }

    #[test]
    fn gather_rejects_ids_out_of_range() {
        let mut b = GraphBuilder::default();
        let table = b.parameter("t", tensor(DType::F32, &[3, 2], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]));
        let ids = b.input("ids", DType::I32, &[2]);
        let y = b.gather(table, ids).unwrap();
        let g = b.finish(&[y]);
        let run = |a: f32, c: f32| evaluate(&g, &[tensor(DType::I32, &[2], &[a, c])], &[]);
        assert_eq!(run(2.0, 0.0).unwrap()[0].to_f64_vec(), [4.0, 5.0, 0.0, 1.0]);
        assert!(matches!(run(3.0, 0.0), Err(Error::Runtime(_))));
        assert!(matches!(run(0.0, -1.0), Err(Error::Runtime(_))));
    }

    #[test]
    fn take_along_axis_reads_the_indexed_entries() {
        let mut b = GraphBuilder::default();
        let x = b.constant(tensor(DType::F32, &[2, 3], &[10.0, 20.0, 30.0, 40.0, 50.0, 60.0]));
        let idx = b.constant(tensor(DType::U32, &[2, 2], &[2.0, 0.0, 1.0, 1.0]));
        let y = b.take_along_axis(x, idx, -1).unwrap();
        assert_eq!(eval1(b, y, &[]), [30.0, 10.0, 50.0, 50.0]);
    }

    #[test]
    fn topk_breaks_ties_by_lower_index() {
        let mut b = GraphBuilder::default();
        let x = b.constant(tensor(DType::F32, &[4], &[1.0, 3.0, 3.0, 2.0]));
        let y = b.topk(x, 3).unwrap();
        assert_eq!(eval1(b, y, &[]), [1.0, 2.0, 3.0]);
    }

    #[test]
    fn topk_can_break_ties_by_higher_index() {
        let mut b = GraphBuilder::default();
        let x = b.constant(tensor(DType::F32, &[6], &[3.0, 1.0, 3.0, 2.0, 3.0, 2.0]));
        let y = b.topk_ties(x, 5, true).unwrap();
        assert_eq!(eval1(b, y, &[]), [4.0, 2.0, 0.0, 5.0, 3.0]);
    }

    #[test]
    fn argsort_is_stable_both_ways() {
        // [2, 1, 2, 0]: ascending 0 (3), 1 (1), 2 (0), 2 (2); descending 2 (0), 2 (2), 1, 0.
        for (descending, want) in [(false, [3.0, 1.0, 0.0, 2.0]), (true, [0.0, 2.0, 1.0, 3.0])] {
            let mut b = GraphBuilder::default();
            let x = b.constant(tensor(DType::I32, &[4], &[2.0, 1.0, 2.0, 0.0]));
            let y = b.argsort(x, descending).unwrap();
            assert_eq!(eval1(b, y, &[]), want);
        }
    }

    #[test]
    fn layout_ops_on_a_two_by_three() {
        // x = [[0, 1, 2], [3, 4, 5]].
        let values = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0];
        let mut b = GraphBuilder::default();
        let x = b.constant(tensor(DType::F32, &[2, 3], &values));
        let t = b.transpose(x, &[1, 0]).unwrap();
        let s = b.slice(x, &[0, 0], &[2, 3], &[1, 2]).unwrap();
        let extra = b.constant(tensor(DType::F32, &[2, 1], &[6.0, 7.0]));
        let c = b.concat(&[x, extra], 1).unwrap();
        let col = b.constant(tensor(DType::F32, &[2, 1], &[1.0, 2.0]));
        let bc = b.broadcast_to(col, &[2, 3]).unwrap();
        let out = evaluate(&b.finish(&[t, s, c, bc]), &[], &[]).unwrap();
        assert_eq!(out[0].to_f64_vec(), [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        assert_eq!(out[1].to_f64_vec(), [0.0, 2.0, 3.0, 5.0]);
        assert_eq!(out[2].to_f64_vec(), [0.0, 1.0, 2.0, 6.0, 3.0, 4.0, 5.0, 7.0]);
        assert_eq!(out[3].to_f64_vec(), [1.0, 1.0, 1.0, 2.0, 2.0, 2.0]);
    }

    #[test]
    fn where_and_compare_select_elementwise() {
        let mut b = GraphBuilder::default();
        let x = b.constant(tensor(DType::F32, &[3], &[-1.0, 2.0, 0.0]));
        let zero = b.scalar(0.0, DType::F32);
        let positive = b.compare(CompareOp::Gt, x, zero).unwrap();
        let y = b.where_(positive, x, zero).unwrap();
        let out = evaluate(&b.finish(&[positive, y]), &[], &[]).unwrap();
        assert_eq!(out[0].dtype, DType::Bool);
        assert_eq!(out[0].to_f64_vec(), [0.0, 1.0, 0.0]);
        assert_eq!(out[1].to_f64_vec(), [0.0, 2.0, 0.0]);
    }

    #[test]
    fn sampling_picks_a_logit_no_gumbel_draw_can_overcome() {
        // Gumbel noise from 24-bit uniforms lies within about [-2.9, 17.3], so a lead of 100 wins.
        let mut b = GraphBuilder::default();
        let mut logits = vec![0.0; 10];
        logits[3] = 100.0;
        logits[5] = 100.0;
        let x = b.constant(tensor(DType::F32, &[2, 5], &logits));
        let counter = b.input("counter", DType::U32, &[]);
        let y = b.sample_categorical(x, counter, 11).unwrap();
        assert_eq!(eval1(b, y, &[tensor(DType::U32, &[], &[4.0])]), [3.0, 0.0]);
    }

    #[test]
    fn inputs_and_states_of_the_wrong_shape_are_rejected() {
        let mut b = GraphBuilder::default();
        let x = b.input("x", DType::F32, &[2]);
        let s = b.state("s", DType::F32, &[2]);
        let y = b.add(x, s).unwrap();
        let g = b.finish(&[y]);
        let good = tensor(DType::F32, &[2], &[1.0, 2.0]);
        assert!(evaluate(&g, &[tensor(DType::F32, &[3], &[0.0; 3])], &[]).is_err());
        assert!(evaluate(
            &g,
            std::slice::from_ref(&good),
            &[("s".into(), tensor(DType::F16, &[2], &[0.0; 2]))]
        )
        .is_err());
        assert!(evaluate(&g, std::slice::from_ref(&good), &[("nope".into(), good.clone())]).is_err());
        assert_eq!(
            evaluate(&g, std::slice::from_ref(&good), &[("s".into(), good.clone())]).unwrap()[0].to_f64_vec(),
            [2.0, 4.0]
        );
    }

    /// The name of every op (each unary, binary, compare and reduce kind counted apart).
    #[rustfmt::skip]
    const ALL_OPS: [&str; 59] = [
        "parameter", "constant", "input", "state",
        "neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "silu", "gelu", "gelu_tanh", "softcap",
        "sin", "cos",
        "add", "sub", "mul", "div", "maximum", "minimum",
        "equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "where", "astype",
        "sum", "max", "min", "argmax", "logsumexp", "softmax", "cumsum",
        "matmul", "quantized_matmul", "gather_qmm",
        "rms_norm", "layer_norm", "rope", "attention", "paged_attention", "kv_write", "gather", "quantized_gather", "take_along_axis",
        "reshape", "transpose", "slice", "concat", "broadcast",
        "topk", "argsort", "sample_categorical",
    ];

    #[test]
    fn every_case_builds_evaluates_and_matches_its_graph() {
        let cases = super::super::cases::all();
        let mut names = std::collections::HashSet::new();
        let mut seen = std::collections::HashSet::new();
        for case in &cases {
            assert!(names.insert(case.name.clone()), "duplicate case name {}", case.name);
            assert_eq!(case.tolerance.len(), case.graph.outputs.len(), "{}", case.name);
            let out = case.expected().unwrap_or_else(|e| panic!("{}: {e}", case.name));
            assert_eq!(out.len(), case.graph.outputs.len(), "{}", case.name);
            for (t, &id) in out.iter().zip(&case.graph.outputs) {
                let node = case.graph.node(id);
                assert_eq!((t.dtype, &t.shape), (node.dtype, &node.shape), "{}", case.name);
                // Only the conversion cases feed NaN and infinities on purpose.
                let finite = t.to_f64_vec().iter().all(|v| v.is_finite());
                assert!(
                    finite || case.name.starts_with("astype/"),
                    "{}: non-finite output",
                    case.name
                );
            }
            seen.extend(case.graph.nodes.iter().map(|n| n.op.name()));
        }
        let missing: Vec<&str> = ALL_OPS.into_iter().filter(|op| !seen.contains(op)).collect();
        assert!(missing.is_empty(), "ops without a case: {missing:?}");
        assert!((150..=600).contains(&cases.len()), "{} cases", cases.len());
    }
}
