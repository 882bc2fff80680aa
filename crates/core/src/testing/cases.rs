//! The op cases every backend runs against [`super::reference`]: each op in each dtype it
//! supports, at odd sizes (31/32/33 along reduced and inner axes), plus promotion, broadcasting
//! and small multi-op graphs that exercise a backend's planner. Weights are parameters,
//! activations runtime inputs, KV caches states with random initial contents. Inputs are random
//! but deterministic: each case seeds its generator from its own name.
//!
//! Tolerances are [`Tolerance::for_dtype`] of each output, scaled where noted: a kernel that
//! accumulates K products in f32 drifts from the f64 reference by about √K roundings, and the
//! defaults hold to about K = 32 (`accumulation`).

use super::{OpCase, Tolerance};
use crate::builder::{BuilderOptions, GraphBuilder};
use crate::dtype::{DType, PromotionPolicy};
use crate::error::Result;
use crate::graph::NodeId;
use crate::op::{BinaryOp, CompareOp, Op, ReduceOp, UnaryOp};
use crate::quant::quantize;
use crate::rng::SplitMix64;
use crate::tensor::{numel, HostTensor};

use DType::{Bool, BF16, F16, F32, I32, U32, U8};

const FLOATS: [DType; 3] = [F32, F16, BF16];
/// Sizes just below, at and above a power of two, for the inner or reduced axis.
const ODD: [usize; 3] = [31, 32, 33];
/// Tolerance factor for ops that only move or convert values: they must match bit for bit.
const BIT_EXACT: f64 = 0.0;

/// A function that appends one family of cases.
type Family = fn(&mut Vec<OpCase>) -> Result<()>;
/// A shape written inline in a case table.
type Shape = &'static [usize];

/// Every op case (about five hundred; together they evaluate in well under a second).
pub fn all() -> Vec<OpCase> {
    let families: &[Family] = &[
        unary,
        binary,
        promotion,
        compare_and_where,
        astype,
        reductions,
        matmul,
        quantized,
        gathers,
        norms,
        rope,
        attention,
        paged_attention,
        kv_write,
        layout,
        sorting,
        sampling,
        graphs,
    ];
    let mut cases = Vec::new();
    for family in families {
        if let Err(e) = family(&mut cases) {
            panic!("an op case does not build: {e}");
        }
    }
    cases
}

/// A shape or index list for case names: `[2, 3]` as `2x3`, `[]` as `scalar`.
fn dims(shape: &[usize]) -> String {
    if shape.is_empty() {
        return "scalar".into();
    }
    shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x")
}

/// Axis indices or bounds for case names: `[0, 2, 1]` as `0,2,1`.
fn list(v: &[usize]) -> String {
    v.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(",")
}

/// The tolerance factor for sums of `k` products (√K growth of rounding, relative to K = 32).
fn accumulation(k: usize) -> f64 {
    (k as f64 / 32.0).sqrt().max(1.0)
}

/// A case under construction: the builder plus the runtime inputs and initial states it needs.
struct Case {
    name: String,
    b: GraphBuilder,
    rng: SplitMix64,
    inputs: Vec<HostTensor>,
    states: Vec<(String, HostTensor)>,
}

impl Case {
    fn new(name: String) -> Case {
        Case::with_options(name, BuilderOptions::default())
    }

    fn with_options(name: String, options: BuilderOptions) -> Case {
        // FNV-1a of the name: a case's data does not depend on its place in the list.
        let seed = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, c| {
            (h ^ c as u64).wrapping_mul(0x0100_0000_01b3)
        });
        Case {
            name,
            b: GraphBuilder::new(options),
            rng: SplitMix64(seed),
            inputs: vec![],
            states: vec![],
        }
    }

    /// Uniform values in `[lo, hi)` stored as `dtype` (floats round; integer dtypes truncate).
    fn uniform(&mut self, dtype: DType, shape: &[usize], lo: f32, hi: f32) -> Result<HostTensor> {
        let values: Vec<f32> = (0..numel(shape))
            .map(|_| lo + (self.rng.next_signed() + 1.0) * 0.5 * (hi - lo))
            .collect();
        HostTensor::from_f32(dtype, shape, &values)
    }

    /// Whole numbers `lo..hi`, times `step`, stored as `dtype`: repeats make ties likely.
    fn grid(&mut self, dtype: DType, shape: &[usize], lo: i64, hi: i64, step: f32) -> Result<HostTensor> {
        let values: Vec<f32> = (0..numel(shape))
            .map(|_| (lo + self.rng.below((hi - lo) as u64) as i64) as f32 * step)
            .collect();
        HostTensor::from_f32(dtype, shape, &values)
    }

    fn input_tensor(&mut self, name: &str, t: HostTensor) -> NodeId {
        let id = self.b.input(name, t.dtype, &t.shape);
        self.inputs.push(t);
        id
    }

    /// An activation uniform in `[-scale, scale)`.
    fn input(&mut self, name: &str, dtype: DType, shape: &[usize], scale: f32) -> Result<NodeId> {
        self.input_in(name, dtype, shape, -scale, scale)
    }

    fn input_in(&mut self, name: &str, dtype: DType, shape: &[usize], lo: f32, hi: f32) -> Result<NodeId> {
        let t = self.uniform(dtype, shape, lo, hi)?;
        Ok(self.input_tensor(name, t))
    }

    /// Integer-valued input (ids, positions, integer operands) in `lo..hi`.
    fn ints(&mut self, name: &str, dtype: DType, shape: &[usize], lo: i64, hi: i64) -> Result<NodeId> {
        let t = self.grid(dtype, shape, lo, hi, 1.0)?;
        Ok(self.input_tensor(name, t))
    }

    fn input_values(&mut self, name: &str, dtype: DType, shape: &[usize], values: &[f32]) -> Result<NodeId> {
        let t = HostTensor::from_f32(dtype, shape, values)?;
        Ok(self.input_tensor(name, t))
    }

    fn param(&mut self, name: &str, dtype: DType, shape: &[usize], scale: f32) -> Result<NodeId> {
        self.param_in(name, dtype, shape, -scale, scale)
    }

    fn param_in(&mut self, name: &str, dtype: DType, shape: &[usize], lo: f32, hi: f32) -> Result<NodeId> {
        let t = self.uniform(dtype, shape, lo, hi)?;
        Ok(self.b.parameter(name, t))
    }

    /// A state (KV cache) whose initial contents are random in `[-1, 1)`.
    fn state(&mut self, name: &str, dtype: DType, shape: &[usize]) -> Result<NodeId> {
        let t = self.uniform(dtype, shape, -1.0, 1.0)?;
        self.states.push((name.to_string(), t));
        Ok(self.b.state(name, dtype, shape))
    }

    /// Random weights `[.., cols]` (leading axes `lead`) quantized MLX-style, as parameters: the
    /// packed `u32` words and the `dtype` scales and biases.
    fn quantized(
        &mut self,
        name: &str,
        lead: &[usize],
        cols: usize,
        q: (u32, usize),
        dtype: DType,
    ) -> Result<[NodeId; 3]> {
        let (bits, group) = q;
        let rows = numel(lead);
        let w = self.rng.signed_vec(rows * cols, 0.5);
        let qw = quantize(&w, rows, cols, bits, group);
        let shape = |last: usize| [lead, &[last]].concat();
        let packed = HostTensor::from_slice(&shape(cols * bits as usize / 32), &qw.packed)?;
        let scales = HostTensor::from_f32(dtype, &shape(cols / group), &qw.scales)?;
        let biases = HostTensor::from_f32(dtype, &shape(cols / group), &qw.biases)?;
        Ok([
            self.b.parameter(&format!("{name}.weight"), packed),
            self.b.parameter(&format!("{name}.scales"), scales),
            self.b.parameter(&format!("{name}.biases"), biases),
        ])
    }

    /// The finished case; each output's tolerance is its dtype's default times `factor`
    /// (integer and bool outputs stay exact).
    fn finish(self, outputs: &[NodeId], factor: f64) -> OpCase {
        let graph = self.b.finish(outputs);
        let tolerance = outputs
            .iter()
            .map(|&o| Tolerance::for_dtype(graph.node(o).dtype).scaled(factor))
            .collect();
        OpCase {
            name: self.name,
            graph,
            inputs: self.inputs,
            states: self.states,
            tolerance,
        }
    }
}

// ---- elementwise ----

const UNARY: [UnaryOp; 14] = [
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Exp,
    UnaryOp::Log,
    UnaryOp::Sqrt,
    UnaryOp::Rsqrt,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
    UnaryOp::Silu,
    UnaryOp::GeluErf,
    UnaryOp::GeluTanh,
    UnaryOp::Softcap(5.0),
    UnaryOp::Sin,
    UnaryOp::Cos,
];

/// Inside each op's domain, and wide enough to reach its curvature.
fn unary_range(op: UnaryOp) -> (f32, f32) {
    match op {
        UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt => (0.05, 4.0),
        UnaryOp::Softcap(_) => (-15.0, 15.0),
        UnaryOp::Sin | UnaryOp::Cos => (-6.0, 6.0),
        UnaryOp::Neg | UnaryOp::Abs => (-1.0, 1.0),
        _ => (-5.0, 5.0),
    }
}

fn unary(cases: &mut Vec<OpCase>) -> Result<()> {
    for (i, &op) in UNARY.iter().enumerate() {
        for (j, &dt) in FLOATS.iter().enumerate() {
            let n = ODD[(i + j) % 3];
            let mut c = Case::new(format!("unary/{}/{dt}/n{n}", Op::Unary(op).name()));
            let (lo, hi) = unary_range(op);
            let x = c.input_in("x", dt, &[3, n], lo, hi)?;
            let y = c.b.unary(op, x)?;
            cases.push(c.finish(&[y], 1.0));
        }
    }
    // Neg and abs stay integer; exp and sqrt compute in f32 behind an AsType.
    for (op, dt, lo, hi) in [
        (UnaryOp::Neg, I32, -100, 100),
        (UnaryOp::Abs, I32, -100, 100),
        (UnaryOp::Exp, I32, -5, 5),
        (UnaryOp::Sqrt, U32, 0, 1000),
    ] {
        let mut c = Case::new(format!("unary/{}/{dt}/n33", Op::Unary(op).name()));
        let x = c.ints("x", dt, &[3, 33], lo, hi)?;
        let y = c.b.unary(op, x)?;
        cases.push(c.finish(&[y], 1.0));
    }
    Ok(())
}

const BINARY: [BinaryOp; 6] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Maximum,
    BinaryOp::Minimum,
];

/// Operands for `op` in `dt`: divisors away from zero, and integers that cannot overflow (the
/// reference saturates where hardware wraps); unsigned `a > b` so `a - b` stays non-negative.
fn binary_operands(c: &mut Case, op: BinaryOp, dt: DType, sa: &[usize], sb: &[usize]) -> Result<(NodeId, NodeId)> {
    if dt.is_float() {
        let a = c.input("a", dt, sa, 1.0)?;
        let b = if op == BinaryOp::Div {
            c.input_in("b", dt, sb, 0.25, 1.25)?
        } else {
            c.input("b", dt, sb, 1.0)?
        };
        return Ok((a, b));
    }
    let (a_lo, b_lo, b_hi) = match (dt, op) {
        (U32, _) => (100, 1, 100),
        (_, BinaryOp::Div) => (-100, 1, 20),
        _ => (-100, -100, 100),
    };
    Ok((c.ints("a", dt, sa, a_lo, 200)?, c.ints("b", dt, sb, b_lo, b_hi)?))
}

fn binary(cases: &mut Vec<OpCase>) -> Result<()> {
    for (i, &op) in BINARY.iter().enumerate() {
        for (j, &dt) in [F32, F16, BF16, I32, U32].iter().enumerate() {
            let n = ODD[(i + j) % 3];
            let mut c = Case::new(format!("binary/{}/{dt}/n{n}", Op::Binary(op).name()));
            let (a, b) = binary_operands(&mut c, op, dt, &[3, n], &[3, n])?;
            let y = c.b.binary(op, a, b)?;
            cases.push(c.finish(&[y], 1.0));
        }
    }
    let broadcasts: [(BinaryOp, DType, Shape, Shape); 5] = [
        (BinaryOp::Add, F32, &[3, 1, 33], &[4, 33]),
        (BinaryOp::Mul, F16, &[5, 33], &[33]),
        (BinaryOp::Sub, BF16, &[31, 1], &[1, 8]),
        (BinaryOp::Maximum, I32, &[3, 33], &[]),
        (BinaryOp::Div, F32, &[2, 3, 32], &[2, 1, 1]),
    ];
    for (op, dt, sa, sb) in broadcasts {
        let mut c = Case::new(format!(
            "binary/{}/{dt}/broadcast_{}_{}",
            Op::Binary(op).name(),
            dims(sa),
            dims(sb)
        ));
        let (a, b) = binary_operands(&mut c, op, dt, sa, sb)?;
        let y = c.b.binary(op, a, b)?;
        cases.push(c.finish(&[y], 1.0));
    }
    Ok(())
}

fn promotion(cases: &mut Vec<OpCase>) -> Result<()> {
    // Mixed operands: the builder inserts AsType nodes to the promoted dtype.
    let pairs = [
        (BinaryOp::Add, F16, BF16, false), // → f32 (both cast)
        (BinaryOp::Mul, F32, BF16, false), // → f32
        (BinaryOp::Add, F32, BF16, true),  // → bf16 under bf16_wins_over_f32
        (BinaryOp::Sub, I32, F16, false),  // → f16
        (BinaryOp::Mul, U32, F32, false),  // → f32
        (BinaryOp::Div, I32, I32, false),  // → f32 (true division)
        (BinaryOp::Maximum, BF16, I32, false),
    ];
    for (op, da, db, bf16_wins) in pairs {
        let policy = PromotionPolicy {
            bf16_wins_over_f32: bf16_wins,
        };
        let suffix = if bf16_wins { "/bf16_wins" } else { "" };
        let name = format!("promotion/{}/{da}+{db}{suffix}", Op::Binary(op).name());
        let mut c = Case::with_options(name, BuilderOptions { promotion: policy });
        let a = if da.is_float() {
            c.input("a", da, &[3, 33], 1.0)?
        } else {
            c.ints("a", da, &[3, 33], 0, 50)?
        };
        let b = if db.is_float() {
            c.input_in("b", db, &[3, 33], 0.5, 2.0)?
        } else {
            c.ints("b", db, &[3, 33], 1, 50)?
        };
        let y = c.b.binary(op, a, b)?;
        cases.push(c.finish(&[y], 1.0));
    }
    // Weak scalars take the tensor's dtype instead of promoting it.
    for (dt, add, value) in [
        (F16, false, 0.125),
        (BF16, true, 1.5),
        (F32, false, -3.0),
        (I32, true, 7.0),
        (U32, false, 3.0),
    ] {
        let op = if add { "add" } else { "mul" };
        let mut c = Case::new(format!("weak_scalar/{op}/{dt}/{value}"));
        let x = if dt.is_float() {
            c.input("x", dt, &[2, 31], 2.0)?
        } else {
            c.ints("x", dt, &[2, 31], 0, 100)?
        };
        let y = if add {
            c.b.add_scalar(x, value)?
        } else {
            c.b.mul_scalar(x, value)?
        };
        cases.push(c.finish(&[y], 1.0));
    }
    Ok(())
}

const COMPARE: [CompareOp; 6] = [
    CompareOp::Eq,
    CompareOp::Ne,
    CompareOp::Lt,
    CompareOp::Le,
    CompareOp::Gt,
    CompareOp::Ge,
];

fn compare_and_where(cases: &mut Vec<OpCase>) -> Result<()> {
    for (i, &op) in COMPARE.iter().enumerate() {
        // bf16 only for two ops: its comparisons are those of f32 on widened values.
        for (j, &dt) in [F32, I32, BF16].iter().enumerate() {
            if dt == BF16 && !matches!(op, CompareOp::Eq | CompareOp::Lt) {
                continue;
            }
            let n = ODD[(i + j) % 3];
            let mut c = Case::new(format!("compare/{}/{dt}/n{n}", Op::Compare(op).name()));
            // Quarter steps in [-1, 1]: equal pairs are common.
            let a = c.grid(dt, &[3, n], -4, 5, if dt.is_float() { 0.25 } else { 1.0 })?;
            let b = c.grid(dt, &[3, n], -4, 5, if dt.is_float() { 0.25 } else { 1.0 })?;
            let (a, b) = (c.input_tensor("a", a), c.input_tensor("b", b));
            let y = c.b.compare(op, a, b)?;
            cases.push(c.finish(&[y], 1.0));
        }
    }
    {
        let mut c = Case::new("compare/less/f16+bf16/broadcast".into());
        let a = c.input("a", F16, &[4, 33], 1.0)?;
        let b = c.input("b", BF16, &[33], 1.0)?;
        let y = c.b.compare(CompareOp::Lt, a, b)?;
        cases.push(c.finish(&[y], 1.0));
    }
    let wheres: [(DType, DType, Shape, Shape, Shape); 4] = [
        (F32, F32, &[3, 33], &[3, 33], &[3, 33]),
        (F16, F16, &[3, 1], &[3, 32], &[32]),
        (BF16, F32, &[2, 31], &[2, 31], &[2, 31]),
        (I32, I32, &[33], &[4, 33], &[4, 33]),
    ];
    for (da, db, sc, sa, sb) in wheres {
        let mut c = Case::new(format!("where/{da}+{db}/cond{}/a{}/b{}", dims(sc), dims(sa), dims(sb)));
        let cond = c.ints("cond", Bool, sc, 0, 2)?;
        let a = if da.is_float() {
            c.input("a", da, sa, 1.0)?
        } else {
            c.ints("a", da, sa, -50, 50)?
        };
        let b = if db.is_float() {
            c.input("b", db, sb, 1.0)?
        } else {
            c.ints("b", db, sb, -50, 50)?
        };
        let y = c.b.where_(cond, a, b)?;
        cases.push(c.finish(&[y], BIT_EXACT));
    }
    {
        let mut c = Case::new("where/f16/cond_from_compare".into());
        let a = c.input("a", F16, &[3, 32], 1.0)?;
        let b = c.input("b", F16, &[3, 32], 1.0)?;
        let cond = c.b.compare(CompareOp::Gt, a, b)?;
        let y = c.b.where_(cond, a, b)?;
        cases.push(c.finish(&[y, cond], BIT_EXACT));
    }
    Ok(())
}

/// Values every conversion must get right: NaN, infinities, signed zero, halfway cases, f16
/// overflow, f16 subnormals, integer saturation.
const SPECIALS: [f32; 16] = [
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    -0.0,
    0.5,
    -0.5,
    2.5,
    -2.7,
    65519.0,
    65520.0,
    1e-6,
    3e9,
    -3e9,
    255.9,
    256.0,
    1.0 / 3.0,
];

fn astype(cases: &mut Vec<OpCase>) -> Result<()> {
    for from in [F32, F16, BF16, I32, U32, Bool] {
        // Float sources go everywhere; integer and bool sources to the floats and one another.
        let targets: &[DType] = if from.is_float() {
            &[F32, F16, BF16, I32, U32, U8, Bool]
        } else {
            &[F32, F16, BF16, I32, U32, Bool]
        };
        for &to in targets {
            if from == to || (from == Bool && to == U32) || (from == U32 && to == F16) {
                continue;
            }
            let mut c = Case::new(format!("astype/{from}/to_{to}"));
            let x = match from {
                I32 => c.grid(I32, &[2, 33], -70_000, 70_000, 1.0)?,
                U32 => c.grid(U32, &[2, 33], 0, 3_000_000_000, 1.0)?,
                Bool => c.grid(Bool, &[2, 33], 0, 2, 1.0)?,
                _ => {
                    let mut values = c.uniform(F32, &[2, 33], -300.0, 300.0)?.to_f32_vec();
                    values[..SPECIALS.len()].copy_from_slice(&SPECIALS);
                    HostTensor::from_f32(from, &[2, 33], &values)?
                }
            };
            let x = c.input_tensor("x", x);
            let y = c.b.astype(x, to);
            cases.push(c.finish(&[y], BIT_EXACT));
        }
    }
    Ok(())
}

// ---- reductions ----

const REDUCE: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::ArgMax,
    ReduceOp::LogSumExp,
];

fn reductions(cases: &mut Vec<OpCase>) -> Result<()> {
    for (i, &op) in REDUCE.iter().enumerate() {
        let name = Op::Reduce {
            op,
            axis: 0,
            keepdims: false,
        }
        .name();
        for (j, &dt) in FLOATS.iter().enumerate() {
            let n = ODD[(i + j) % 3];
            let keepdims = (i + j) % 2 == 1;
            let mut c = Case::new(format!(
                "reduce/{name}/{dt}/last{n}{}",
                if keepdims { "/keepdims" } else { "" }
            ));
            let x = c.input("x", dt, &[4, n], 3.0)?;
            let y = c.b.reduce(op, x, -1, keepdims)?;
            cases.push(c.finish(&[y], accumulation(n)));
        }
        // A middle axis: strided lanes.
        let (dt, n) = (FLOATS[i % 3], ODD[(i + 1) % 3]);
        let mut c = Case::new(format!("reduce/{name}/{dt}/axis1_of_3x{n}x5"));
        let x = c.input("x", dt, &[3, n, 5], 3.0)?;
        let y = c.b.reduce(op, x, 1, i % 2 == 0)?;
        cases.push(c.finish(&[y], accumulation(n)));
        if op != ReduceOp::LogSumExp {
            // Few distinct values, so argmax meets ties.
            let mut c = Case::new(format!("reduce/{name}/i32/last33/ties"));
            let x = c.ints("x", I32, &[4, 33], -5, 5)?;
            let y = c.b.reduce(op, x, -1, false)?;
            cases.push(c.finish(&[y], 1.0));
        }
    }
    // Argmax over vocabulary-long rows (on CUDA: split over many blocks). Integers in [-40, 40]
    // as floats, so the maximum ties many times across the row and the first index must win.
    for &dt in &FLOATS {
        let mut c = Case::new(format!("reduce/argmax/{dt}/last50001/ties"));
        let x = c.ints("x", I32, &[2, 50001], -40, 40)?;
        let x = c.b.astype(x, dt);
        let y = c.b.reduce(ReduceOp::ArgMax, x, -1, false)?;
        cases.push(c.finish(&[y], 1.0));
        // Spread values: the maximum anywhere in the row.
        let mut c = Case::new(format!("reduce/argmax/{dt}/last50001"));
        let x = c.input("x", dt, &[2, 50001], 3.0)?;
        let y = c.b.reduce(ReduceOp::ArgMax, x, -1, false)?;
        cases.push(c.finish(&[y], 1.0));
    }
    for (i, &dt) in FLOATS.iter().enumerate() {
        let n = ODD[i];
        let mut c = Case::new(format!("softmax/{dt}/last{n}"));
        let x = c.input("x", dt, &[3, n], 4.0)?;
        let y = c.b.softmax(x, -1)?;
        cases.push(c.finish(&[y], 1.0));
        let mut c = Case::new(format!("softmax/{dt}/axis0_of_{n}x5"));
        let x = c.input("x", dt, &[n, 5], 4.0)?;
        let y = c.b.softmax(x, 0)?;
        cases.push(c.finish(&[y], 1.0));
    }
    {
        let mut c = Case::new("softmax/i32/computes_in_f32".into());
        let x = c.ints("x", I32, &[2, 31], -3, 3)?;
        let y = c.b.softmax(x, -1)?;
        cases.push(c.finish(&[y], 1.0));
    }
    for (i, &dt) in [F32, F16, BF16, I32].iter().enumerate() {
        for reverse in [false, true] {
            let n = ODD[(i + usize::from(reverse)) % 3];
            let dir = if reverse { "reverse" } else { "forward" };
            let mut c = Case::new(format!("cumsum/{dt}/last{n}/{dir}"));
            let x = if dt.is_float() {
                c.input("x", dt, &[3, n], 1.0)?
            } else {
                c.ints("x", dt, &[3, n], -50, 50)?
            };
            let y = c.b.cumsum(x, -1, reverse)?;
            // Running sums grow to several units: allow a few roundings more.
            cases.push(c.finish(&[y], 2.0));
        }
    }
    for dt in [F32, I32] {
        let mut c = Case::new(format!("cumsum/{dt}/axis0_of_33x4/reverse"));
        let x = if dt.is_float() {
            c.input("x", dt, &[33, 4], 1.0)?
        } else {
            c.ints("x", dt, &[33, 4], -50, 50)?
        };
        let y = c.b.cumsum(x, 0, true)?;
        cases.push(c.finish(&[y], 2.0));
    }
    Ok(())
}

// ---- linear algebra ----

fn matmul(cases: &mut Vec<OpCase>) -> Result<()> {
    for (j, &dt) in FLOATS.iter().enumerate() {
        for k in [31, 32, 33, 256] {
            let n = ODD[(k + j) % 3];
            let mut c = Case::new(format!("matmul/{dt}/m5/k{k}/n{n}"));
            let x = c.input("x", dt, &[5, k], 1.0)?;
            let w = c.param("w", dt, &[k, n], 1.0 / (k as f32).sqrt())?;
            let y = c.b.matmul(x, w)?;
            cases.push(c.finish(&[y], accumulation(k)));
        }
        let mut c = Case::new(format!("matmul_t/{dt}/linear/2x3x64/n33"));
        let x = c.input("x", dt, &[2, 3, 64], 1.0)?;
        let w = c.param("w", dt, &[33, 64], 0.125)?;
        let y = c.b.matmul_t(x, w)?;
        cases.push(c.finish(&[y], accumulation(64)));

        let mut c = Case::new(format!("matmul/{dt}/batched_inputs/2x3x5x32@2x3x32x7"));
        let a = c.input("a", dt, &[2, 3, 5, 32], 1.0)?;
        let b = c.input("b", dt, &[2, 3, 32, 7], 1.0)?;
        let y = c.b.matmul(a, b)?;
        cases.push(c.finish(&[y], 1.0));

        let mut c = Case::new(format!("matmul_t/{dt}/batched_scores/2x4x5x33@2x4x9x33"));
        let a = c.input("q", dt, &[2, 4, 5, 33], 1.0)?;
        let b = c.input("k", dt, &[2, 4, 9, 33], 1.0)?;
        let y = c.b.matmul_t(a, b)?;
        cases.push(c.finish(&[y], accumulation(33)));
    }
    {
        let mut c = Case::new("matmul/f32/broadcast_batch/1x4x31@3x31x6".into());
        let a = c.input("a", F32, &[1, 4, 31], 1.0)?;
        let b = c.input("b", F32, &[3, 31, 6], 1.0)?;
        let y = c.b.matmul(a, b)?;
        cases.push(c.finish(&[y], 1.0));
    }
    // Weights keep their stored dtype (kernels widen on load); the output is the promotion.
    for (dx, dw, transpose, k, n) in [
        (F16, F32, false, 64, 31),
        (BF16, F16, true, 64, 33),
        (BF16, BF16, true, 256, 200),
    ] {
        let t = if transpose { "matmul_t" } else { "matmul" };
        let mut c = Case::new(format!("{t}/{dx}_x/{dw}_weight/k{k}/n{n}"));
        let x = c.input("x", dx, &[1, k], 1.0)?;
        let shape = if transpose { [n, k] } else { [k, n] };
        let w = c.param("w", dw, &shape, 1.0 / (k as f32).sqrt())?;
        let y = if transpose {
            c.b.matmul_t(x, w)?
        } else {
            c.b.matmul(x, w)?
        };
        cases.push(c.finish(&[y], accumulation(k)));
    }
    // Prefill-sized linear layers (more rows than a decode GEMV takes), every activation dtype
    // with each weight dtype.
    for &dx in &FLOATS {
        for &dw in &FLOATS {
            let mut c = Case::new(format!("matmul_t/{dx}_x/{dw}_weight/prefill/2x7x64/n40"));
            let x = c.input("x", dx, &[2, 7, 64], 1.0)?;
            let w = c.param("w", dw, &[40, 64], 0.125)?;
            let y = c.b.matmul_t(x, w)?;
            cases.push(c.finish(&[y], accumulation(64)));
        }
    }
    Ok(())
}

fn quantized(cases: &mut Vec<OpCase>) -> Result<()> {
    for (i, bits) in [2u32, 4, 8].into_iter().enumerate() {
        for (j, group) in [32usize, 64, 128].into_iter().enumerate() {
            for (l, &dt) in FLOATS.iter().enumerate() {
                let k = if group == 128 { 256 } else { 128 };
                let n = ODD[(i + j + l) % 3];
                let x_shape: Vec<usize> = match l {
                    0 => vec![3, k],
                    1 => vec![2, 3, k],
                    _ => vec![1, k],
                };
                let mut c = Case::new(format!(
                    "quantized_matmul/{dt}/{bits}bit/g{group}/x{}/n{n}",
                    dims(&x_shape)
                ));
                let x = c.input("x", dt, &x_shape, 1.0)?;
                let [w, s, b] = c.quantized("proj", &[n], k, (bits, group), dt)?;
                let y = c.b.quantized_matmul(x, w, s, b, bits, group)?;
                cases.push(c.finish(&[y], accumulation(k)));
            }
        }
    }
    {
        let mut c = Case::new("quantized_matmul/f32_x/f16_scales/4bit/g64".into());
        let x = c.input("x", F32, &[3, 128], 1.0)?;
        let [w, s, b] = c.quantized("proj", &[33], 128, (4, 64), F16)?;
        let y = c.b.quantized_matmul(x, w, s, b, 4, 64)?;
        cases.push(c.finish(&[y], accumulation(128)));
    }
    // Prefill-sized products (more rows than a decode GEMV takes).
    for &dt in &FLOATS {
        for (bits, group) in [(4u32, 64usize), (8, 32), (2, 128), (4, 32), (4, 128), (8, 128)] {
            let mut c = Case::new(format!("quantized_matmul/{dt}/{bits}bit/g{group}/prefill/12x256/n33"));
            let x = c.input("x", dt, &[12, 256], 1.0)?;
            let [w, s, b] = c.quantized("proj", &[33], 256, (bits, group), dt)?;
            let y = c.b.quantized_matmul(x, w, s, b, bits, group)?;
            cases.push(c.finish(&[y], accumulation(256)));
        }
    }
    // Batched decode steps, 2 to 64 rows (CUDA: qmm_rows, tiles of 8 rows of x, k split when n is
    // narrow; its 128-row blocks partly past n): each tile count, every group size.
    for &dt in &[F16, BF16] {
        for (rows, k, n, group) in [
            (2usize, 256usize, 80usize, 64usize),
            (3, 256, 80, 64),
            (8, 1024, 48, 32),
            (9, 512, 144, 128),
            (16, 384, 16, 32),
            (33, 1024, 160, 64),
            (64, 256, 80, 64),
            (64, 2048, 32, 64),
            // CUDA's ring kernel: 3, 5, 6 and 7 tiles of x; 272 rows (a block with one live
            // tile of 16 of its 8); splits of 4 chunks, more than its ring's 3 stages.
            (24, 1536, 272, 32),
            (40, 640, 96, 64),
            (48, 768, 112, 64),
            (56, 512, 48, 32),
            (20, 4096, 2176, 64),
        ] {
            let mut c = Case::new(format!("quantized_matmul/{dt}/4bit/g{group}/batch/{rows}x{k}/n{n}"));
            let x = c.input("x", dt, &[rows, k], 1.0)?;
            let [w, s, b] = c.quantized("proj", &[n], k, (4, group), dt)?;
            let y = c.b.quantized_matmul(x, w, s, b, 4, group)?;
            cases.push(c.finish(&[y], accumulation(k)));
        }
    }
    // Decode-shaped products: one row of x, k a multiple of 128 (what CUDA's tensor-core GEMV
    // takes; 384 and Gemma 3 1B's 1152 end in a half chunk), n not always a multiple of its
    // 16-row tiles.
    for &dt in &[F16, BF16] {
        for (group, k, n) in [
            (32usize, 256usize, 37usize),
            (64, 768, 20),
            (128, 512, 16),
            (32, 384, 24),
            (64, 1152, 40),
            (128, 384, 16),
        ] {
            let mut c = Case::new(format!("quantized_matmul/{dt}/4bit/g{group}/decode/1x{k}/n{n}"));
            let x = c.input("x", dt, &[1, 1, k], 1.0)?;
            let [w, s, b] = c.quantized("proj", &[n], k, (4, group), dt)?;
            let y = c.b.quantized_matmul(x, w, s, b, 4, group)?;
            cases.push(c.finish(&[y], accumulation(k)));
        }
    }
    // MoE: 4 experts of [31, 64], two per token; x shared by both (X = 1) or one row each.
    for &dt in &FLOATS {
        for (bits, group, x_rows) in [(4u32, 32usize, 1usize), (8, 64, 2), (2, 32, 2)] {
            let mut c = Case::new(format!("gather_qmm/{dt}/{bits}bit/g{group}/x_rows{x_rows}/top2"));
            let x = c.input("x", dt, &[2, x_rows, 64], 1.0)?;
            let [w, s, b] = c.quantized("experts", &[4, 31], 64, (bits, group), dt)?;
            let ids = c.ints("ids", U32, &[2, 2], 0, 4)?;
            let y = c.b.gather_qmm(x, w, s, b, ids, bits, group)?;
            cases.push(c.finish(&[y], accumulation(64)));
        }
    }
    // Decode-shaped routed products (what CUDA's tensor-core gathered GEMV takes): one token,
    // k a multiple of 256, 24 rows an expert (not a multiple of 16).
    for &dt in &[F16, BF16] {
        for (group, x_rows) in [(64usize, 1usize), (32, 2)] {
            let mut c = Case::new(format!("gather_qmm/{dt}/4bit/g{group}/decode/x_rows{x_rows}/top2/k512"));
            let x = c.input("x", dt, &[1, x_rows, 512], 1.0)?;
            let [w, s, b] = c.quantized("experts", &[6, 24], 512, (4, group), dt)?;
            let ids = c.ints("ids", U32, &[1, 2], 0, 6)?;
            let y = c.b.gather_qmm(x, w, s, b, ids, 4, group)?;
            cases.push(c.finish(&[y], accumulation(512)));
        }
    }
    // Prefill-shaped routed products (on CUDA: grouped by expert): 70 tokens, two slots; expert
    // 0 in every token's first slot (more pairs than one tile of 64), the second slot over
    // experts 1-3, expert 4 never chosen. n a multiple of 16 and k of 128 take CUDA's
    // grouped_rows (80 rows: a block's rows partly past n; k 384: three chunks), the others
    // grouped_qmm (80 rows: a partial tile of 64; k 192).
    for &dt in &[F16, BF16] {
        for (group, x_rows, k, n) in [
            (64usize, 1usize, 128usize, 80usize),
            (32, 2, 128, 80),
            (128, 1, 384, 48),
            (64, 2, 192, 24),
        ] {
            let mut c = Case::new(format!(
                "gather_qmm/{dt}/4bit/g{group}/prefill/x_rows{x_rows}/t70/top2/k{k}/n{n}"
            ));
            let x = c.input("x", dt, &[70, x_rows, k], 1.0)?;
            let [w, s, b] = c.quantized("experts", &[5, n], k, (4, group), dt)?;
            let ids: Vec<f32> = (0..70).flat_map(|t| [0.0, (1 + t % 3) as f32]).collect();
            let ids = c.input_values("ids", U32, &[70, 2], &ids)?;
            let y = c.b.gather_qmm(x, w, s, b, ids, 4, group)?;
            cases.push(c.finish(&[y], accumulation(k)));
        }
    }
    {
        let mut c = Case::new("gather_qmm/f16/4bit/g64/rank4/i32_ids".into());
        let x = c.input("x", F16, &[2, 3, 1, 128], 1.0)?;
        let [w, s, b] = c.quantized("experts", &[5, 32], 128, (4, 64), F16)?;
        let ids = c.ints("ids", I32, &[2, 3, 2], 0, 5)?;
        let y = c.b.gather_qmm(x, w, s, b, ids, 4, 64)?;
        cases.push(c.finish(&[y], accumulation(128)));
    }
    for (i, bits) in [2u32, 4, 8].into_iter().enumerate() {
        for (j, group) in [32usize, 64, 128].into_iter().enumerate() {
            let dt = FLOATS[(i + j) % 3];
            let d = if group == 128 { 128 } else { 64 };
            let (id_dtype, id_shape): (DType, &[usize]) = if (i + j) % 2 == 0 { (U32, &[5]) } else { (I32, &[2, 3]) };
            let mut c = Case::new(format!(
                "quantized_gather/{dt}/{bits}bit/g{group}/d{d}/ids{}",
                dims(id_shape)
            ));
            let [w, s, b] = c.quantized("embed", &[40], d, (bits, group), dt)?;
            let ids = c.ints("ids", id_dtype, id_shape, 0, 40)?;
            let y = c.b.quantized_gather(w, s, b, ids, bits, group)?;
            cases.push(c.finish(&[y], 1.0));
        }
    }
    // bf16 scales dequantized straight into f32 (no bf16 rounding of the rows).
    let mut c = Case::new("quantized_gather/bf16_scales/f32_out/4bit/g64".into());
    let [w, s, b] = c.quantized("embed", &[40], 64, (4, 64), BF16)?;
    let ids = c.ints("ids", I32, &[3], 0, 40)?;
    let y = c.b.quantized_gather_as(w, s, b, ids, 4, 64, F32)?;
    cases.push(c.finish(&[y], 1.0));
    Ok(())
}

fn gathers(cases: &mut Vec<OpCase>) -> Result<()> {
    for (i, &dt) in [F32, F16, BF16, I32].iter().enumerate() {
        let (id_dtype, id_shape): (DType, &[usize]) = if i % 2 == 0 { (I32, &[7]) } else { (U32, &[2, 3]) };
        let mut c = Case::new(format!("gather/{dt}/v37/d33/ids{}", dims(id_shape)));
        let table = c.grid(dt, &[37, 33], -100, 100, if dt.is_float() { 0.01 } else { 1.0 })?;
        let table = c.b.parameter("embed", table);
        let ids = c.ints("ids", id_dtype, id_shape, 0, 37)?;
        let y = c.b.gather(table, ids)?;
        cases.push(c.finish(&[y], BIT_EXACT));
    }
    for (i, &dt) in [F32, F16, BF16, I32].iter().enumerate() {
        let n = ODD[i % 3];
        let idx_dtype = if dt == I32 { I32 } else { U32 };
        let mut c = Case::new(format!("take_along_axis/{dt}/last{n}/idx_{idx_dtype}"));
        let x = if dt.is_float() {
            c.input("x", dt, &[3, n], 1.0)?
        } else {
            c.ints("x", dt, &[3, n], -50, 50)?
        };
        let idx = c.ints("idx", idx_dtype, &[3, 5], 0, n as i64)?;
        let y = c.b.take_along_axis(x, idx, -1)?;
        cases.push(c.finish(&[y], BIT_EXACT));
    }
    {
        let mut c = Case::new("take_along_axis/f32/axis0".into());
        let x = c.input("x", F32, &[6, 4], 1.0)?;
        let idx = c.ints("idx", I32, &[2, 4], 0, 6)?;
        let y = c.b.take_along_axis(x, idx, 0)?;
        cases.push(c.finish(&[y], BIT_EXACT));
    }
    Ok(())
}

// ---- fused NN ops ----

fn norms(cases: &mut Vec<OpCase>) -> Result<()> {
    for (j, &dt) in FLOATS.iter().enumerate() {
        for (i, &n) in ODD.iter().enumerate() {
            let unit_offset = (i + j) % 2 == 1;
            let mut c = Case::new(format!(
                "rms_norm/{dt}/d{n}{}",
                if unit_offset { "/unit_offset" } else { "" }
            ));
            let x = c.input("x", dt, &[2, 3, n], 2.0)?;
            let (lo, hi) = if unit_offset { (-0.5, 0.5) } else { (0.5, 1.5) };
            let w = c.param_in("norm.weight", dt, &[n], lo, hi)?;
            let y = c.b.rms_norm(x, w, 1e-5, unit_offset)?;
            cases.push(c.finish(&[y], 1.0));
        }
        let affine = [(true, true), (true, false), (false, false), (false, true)];
        for (i, &(has_weight, has_bias)) in affine.iter().enumerate() {
            if i == 3 && dt != F32 {
                continue;
            }
            let n = ODD[(i + j) % 3];
            let what = match (has_weight, has_bias) {
                (true, true) => "weight_bias",
                (true, false) => "weight",
                (false, true) => "bias",
                (false, false) => "plain",
            };
            let mut c = Case::new(format!("layer_norm/{dt}/d{n}/{what}"));
            let x = c.input_in("x", dt, &[2, 3, n], -0.5, 1.5)?; // off-centre: the mean matters
            let w = if has_weight {
                Some(c.param_in("norm.weight", dt, &[n], 0.5, 1.5)?)
            } else {
                None
            };
            let b = if has_bias {
                Some(c.param("norm.bias", dt, &[n], 0.5)?)
            } else {
                None
            };
            let y = c.b.layer_norm(x, w, b, 1e-5)?;
            cases.push(c.finish(&[y], 1.0));
        }
    }
    // f32 weights promote bf16/f16 activations to f32.
    {
        let mut c = Case::new("rms_norm/bf16_x/f32_weight/d64".into());
        let x = c.input("x", BF16, &[3, 64], 2.0)?;
        let w = c.param_in("norm.weight", F32, &[64], 0.5, 1.5)?;
        let y = c.b.rms_norm(x, w, 1e-6, false)?;
        cases.push(c.finish(&[y], 1.0));
    }
    {
        let mut c = Case::new("layer_norm/f16_x/f32_weight_bias/d33".into());
        let x = c.input("x", F16, &[3, 33], 2.0)?;
        let w = c.param_in("norm.weight", F32, &[33], 0.5, 1.5)?;
        let b = c.param("norm.bias", F32, &[33], 0.5)?;
        let y = c.b.layer_norm(x, Some(w), Some(b), 1e-5)?;
        cases.push(c.finish(&[y], 1.0));
    }
    Ok(())
}

/// `base^(-2i/dims)` for `i < dims/2`, the usual rotary frequencies, as an f32 constant.
fn inv_freq(c: &mut Case, dims: usize) -> Result<NodeId> {
    let freqs: Vec<f32> = (0..dims / 2)
        .map(|i| 10_000f32.powf(-2.0 * i as f32 / dims as f32))
        .collect();
    Ok(c.b.constant(HostTensor::from_f32(F32, &[dims / 2], &freqs)?))
}

fn rope(cases: &mut Vec<OpCase>) -> Result<()> {
    // (batch, heads, T, D, dims, interleaved, positions [B, T], positions dtype, scale)
    let variants = [
        (1, 2, 5, 32, 32, false, false, I32, 1.0),
        (1, 2, 5, 64, 32, false, false, I32, 1.0),
        (2, 3, 4, 64, 64, true, true, I32, 1.0),
        (2, 2, 3, 32, 16, true, false, U32, 0.5),
        (2, 1, 1, 64, 48, false, true, I32, 1.0),
    ];
    for (batch, heads, t, d, dims, interleaved, per_batch, pos_dtype, scale) in variants {
        for &dt in &FLOATS {
            let pairs = if interleaved { "interleaved" } else { "half_split" };
            let pos_shape: Vec<usize> = if per_batch { vec![batch, t] } else { vec![t] };
            let name = format!(
                "rope/{dt}/b{batch}/t{t}/d{d}/dims{dims}/{pairs}/pos{}_{pos_dtype}/scale{scale}",
                self::dims(&pos_shape)
            );
            let mut c = Case::new(name);
            let x = c.input("x", dt, &[batch, heads, t, d], 1.0)?;
            // Consecutive positions from a random start per row, up to about 40.
            let rows = if per_batch { batch } else { 1 };
            let starts: Vec<usize> = (0..rows).map(|_| c.rng.below(35) as usize).collect();
            let positions: Vec<f32> = starts.iter().flat_map(|&s| (s..s + t).map(|p| p as f32)).collect();
            let positions = c.input_values("positions", pos_dtype, &pos_shape, &positions)?;
            let freqs = inv_freq(&mut c, dims)?;
            let y = c.b.rope(x, positions, freqs, dims, interleaved, scale)?;
            // Kernels round angles of up to 40 rad to f32 (a unit in the last place is 4e-6).
            let factor = if dt == F32 { 4.0 } else { 1.0 };
            cases.push(c.finish(&[y], factor));
        }
    }
    Ok(())
}

/// One attention configuration; each runs in every float dtype.
struct Attn {
    batch: usize,
    kv_heads: usize,
    gqa: usize,
    d: usize,
    dv: usize,
    t: usize,
    causal: bool,
    window: Option<usize>,
    softcap: Option<f32>,
    /// `kv_len` and the write position per batch row (`[B]`) rather than one scalar.
    per_batch_len: bool,
    /// Cache slots (the write lands at 7/8 of a long cache, or where it still fits).
    cap: usize,
    /// The write position in place of that rule (a scalar position).
    at: Option<usize>,
}

impl Attn {
    fn name(&self, dt: DType) -> String {
        let mut s = format!("attention/{dt}/b{}/gqa{}/d{}", self.batch, self.gqa, self.d);
        if self.dv != self.d {
            s += &format!("/dv{}", self.dv);
        }
        s += &format!("/t{}/{}", self.t, if self.causal { "causal" } else { "full" });
        if let Some(w) = self.window {
            s += &format!("/window{w}");
        }
        if self.softcap.is_some() {
            s += "/softcap";
        }
        s += if self.per_batch_len {
            "/len_per_batch"
        } else {
            "/len_scalar"
        };
        if self.cap != 40 {
            s += &format!("/cap{}", self.cap);
        }
        if let Some(at) = self.at {
            s += &format!("/at{at}");
        }
        s
    }
}

fn attention(cases: &mut Vec<OpCase>) -> Result<()> {
    #[rustfmt::skip]
    let variants = [
        Attn { batch: 1, kv_heads: 2, gqa: 1, d: 32, dv: 32, t: 1, causal: true, window: None, softcap: None, per_batch_len: false, cap: 40, at: None },
        Attn { batch: 1, kv_heads: 1, gqa: 4, d: 64, dv: 64, t: 1, causal: true, window: None, softcap: Some(2.0), per_batch_len: false, cap: 40, at: None },
        Attn { batch: 2, kv_heads: 2, gqa: 2, d: 32, dv: 32, t: 1, causal: true, window: None, softcap: None, per_batch_len: true, cap: 40, at: None },
        Attn { batch: 1, kv_heads: 2, gqa: 1, d: 64, dv: 64, t: 5, causal: true, window: None, softcap: None, per_batch_len: false, cap: 40, at: None },
        Attn { batch: 1, kv_heads: 2, gqa: 4, d: 32, dv: 32, t: 5, causal: true, window: Some(3), softcap: None, per_batch_len: false, cap: 40, at: None },
        Attn { batch: 2, kv_heads: 1, gqa: 4, d: 64, dv: 64, t: 5, causal: true, window: Some(3), softcap: Some(2.0), per_batch_len: true, cap: 40, at: None },
        Attn { batch: 1, kv_heads: 2, gqa: 2, d: 32, dv: 32, t: 5, causal: false, window: None, softcap: None, per_batch_len: false, cap: 40, at: None },
        Attn { batch: 2, kv_heads: 2, gqa: 1, d: 64, dv: 64, t: 3, causal: false, window: None, softcap: Some(2.0), per_batch_len: true, cap: 40, at: None },
        Attn { batch: 1, kv_heads: 1, gqa: 2, d: 64, dv: 64, t: 1, causal: true, window: Some(3), softcap: None, per_batch_len: false, cap: 40, at: None },
        Attn { batch: 1, kv_heads: 2, gqa: 2, d: 64, dv: 32, t: 2, causal: true, window: None, softcap: None, per_batch_len: false, cap: 40, at: None },
        // Decode shapes of real models over long caches (on CUDA: the grouped-query kernel with
        // several keys a split, the last split partly past the length): llama, qwen2.5-0.5b,
        // gemma (window, softcap, batch rows of different lengths), qwen3-moe.
        Attn { batch: 1, kv_heads: 8, gqa: 4, d: 128, dv: 128, t: 1, causal: true, window: None, softcap: None, per_batch_len: false, cap: 600, at: None },
        Attn { batch: 1, kv_heads: 2, gqa: 7, d: 64, dv: 64, t: 1, causal: true, window: None, softcap: None, per_batch_len: false, cap: 300, at: None },
        Attn { batch: 2, kv_heads: 1, gqa: 4, d: 256, dv: 256, t: 1, causal: true, window: Some(100), softcap: Some(50.0), per_batch_len: true, cap: 300, at: None },
        Attn { batch: 1, kv_heads: 4, gqa: 8, d: 128, dv: 128, t: 1, causal: false, window: None, softcap: None, per_batch_len: false, cap: 200, at: None },
        // Gemma-wide heads in groups of 8 (on CUDA: the per-head kernel at 256 channels).
        Attn { batch: 2, kv_heads: 1, gqa: 8, d: 256, dv: 256, t: 1, causal: true, window: Some(100), softcap: Some(50.0), per_batch_len: true, cap: 300, at: None },
        // Batched decode rows of groups of 4 and 8 (on CUDA: the lanes kernel, 4 heads a block,
        // two blocks a kv head for groups of 8) at 128, 64 and 32 channels.
        Attn { batch: 2, kv_heads: 2, gqa: 4, d: 128, dv: 128, t: 1, causal: true, window: None, softcap: None, per_batch_len: true, cap: 300, at: None },
        Attn { batch: 2, kv_heads: 2, gqa: 8, d: 64, dv: 64, t: 1, causal: true, window: Some(60), softcap: None, per_batch_len: true, cap: 200, at: None },
        Attn { batch: 2, kv_heads: 1, gqa: 4, d: 32, dv: 32, t: 1, causal: true, window: None, softcap: Some(2.0), per_batch_len: false, cap: 40, at: None },
        // Prefill chunks in real head sizes (on CUDA: the tensor-core kernel, several tiles of
        // 64 queries and of 64 keys, the last ones partial): after earlier context, from the
        // start, with a window and softcap over batch rows of different lengths, unmasked.
        Attn { batch: 1, kv_heads: 2, gqa: 4, d: 128, dv: 128, t: 100, causal: true, window: None, softcap: None, per_batch_len: false, cap: 300, at: None },
        Attn { batch: 1, kv_heads: 2, gqa: 7, d: 64, dv: 64, t: 70, causal: true, window: None, softcap: None, per_batch_len: false, cap: 200, at: Some(0) },
        Attn { batch: 2, kv_heads: 1, gqa: 2, d: 64, dv: 64, t: 65, causal: true, window: Some(40), softcap: Some(50.0), per_batch_len: true, cap: 200, at: None },
        Attn { batch: 1, kv_heads: 2, gqa: 1, d: 128, dv: 128, t: 80, causal: false, window: None, softcap: None, per_batch_len: false, cap: 200, at: None },
        Attn { batch: 1, kv_heads: 1, gqa: 2, d: 128, dv: 128, t: 130, causal: true, window: Some(70), softcap: None, per_batch_len: false, cap: 300, at: Some(20) },
    ];
    for a in &variants {
        for &dt in &FLOATS {
            let mut c = Case::new(a.name(dt));
            let (b, hkv, hq, t) = (a.batch, a.kv_heads, a.kv_heads * a.gqa, a.t);
            let k_cache = c.state("k_cache", dt, &[b, hkv, a.cap, a.d])?;
            let v_cache = c.state("v_cache", dt, &[b, hkv, a.cap, a.dv])?;
            // q spans [-4, 4] so scores spread beyond a near-uniform softmax.
            let q = c.input("q", dt, &[b, hq, t, a.d], 4.0)?;
            let k_new = c.input("k", dt, &[b, hkv, t, a.d], 1.0)?;
            let v_new = c.input("v", dt, &[b, hkv, t, a.dv], 1.0)?;
            // Write positions well inside the cache: earlier slots hold the random initial
            // contents the queries must read, later ones must be ignored.
            let long = a.cap > 40;
            let pos = if a.per_batch_len {
                let at = if long {
                    [(a.cap / 3) as f32, (a.cap - 5).min(a.cap - t - 3) as f32]
                } else {
                    [11.0, 23.0]
                };
                c.input_values("pos", I32, &[b], &at[..b])?
            } else {
                let at = match a.at {
                    Some(at) => at,
                    None if long => (a.cap * 7 / 8).min(a.cap - t - 3),
                    None => 17,
                };
                c.input_values("pos", I32, &[], &[at as f32])?
            };
            let k_all = c.b.kv_write(k_cache, k_new, pos)?;
            let v_all = c.b.kv_write(v_cache, v_new, pos)?;
            let kv_len = c.b.add_scalar(pos, t as f32)?; // as a model computes it
            let scale = 1.0 / (a.d as f32).sqrt();
            let y =
                c.b.attention(q, k_all, v_all, kv_len, scale, a.causal, a.window, a.softcap)?;
            // Softmax over up to 40 keys of D-long dot products: twice the default.
            cases.push(c.finish(&[y], 2.0));
        }
    }
    // K and V straight from inputs (no cache), kv_len a u32 input that fills the buffer in one row.
    for dt in [F32, BF16] {
        let mut c = Case::new(format!("attention/{dt}/direct_kv/b2/gqa2/d32/t3/full/len_u32"));
        let q = c.input("q", dt, &[2, 4, 3, 32], 4.0)?;
        let k = c.input("k", dt, &[2, 2, 9, 32], 1.0)?;
        let v = c.input("v", dt, &[2, 2, 9, 32], 1.0)?;
        let kv_len = c.input_values("kv_len", U32, &[2], &[9.0, 6.0])?;
        let y = c.b.attention(q, k, v, kv_len, 1.0 / 32f32.sqrt(), false, None, None)?;
        cases.push(c.finish(&[y], 2.0));
    }
    Ok(())
}

/// One paged-attention configuration: rows of `lens` positions each (this step's `t` tokens
/// last), pool blocks of `bs` slots handed out shuffled, tables `width` wide.
struct Paged {
    lens: &'static [usize],
    kv_heads: usize,
    gqa: usize,
    d: usize,
    t: usize,
    bs: usize,
    width: usize,
    window: Option<usize>,
    softcap: Option<f32>,
}

/// Attention over a paged pool as the serving engine builds it: this step's keys and values
/// written at their slots in a `[1, 1, P, Hkv·D]` pool state (earlier positions hold the
/// pool's random contents, which the queries must read), the pool viewed as `[P, Hkv, D]`,
/// each row's blocks in no order, padding entries block 0.
fn paged_attention(cases: &mut Vec<OpCase>) -> Result<()> {
    #[rustfmt::skip]
    let variants = [
        Paged { lens: &[9, 3], kv_heads: 2, gqa: 2, d: 32, t: 1, bs: 4, width: 4, window: None, softcap: None },
        Paged { lens: &[13, 5, 16], kv_heads: 1, gqa: 4, d: 64, t: 3, bs: 4, width: 4, window: Some(6), softcap: Some(2.0) },
        // Decode shapes of real models (on CUDA: the grouped-query kernel, and the per-head one
        // for 64 channels and groups of 8), blocks of 16, rows of different lengths.
        Paged { lens: &[100, 37, 128], kv_heads: 8, gqa: 4, d: 128, t: 1, bs: 16, width: 8, window: None, softcap: None },
        Paged { lens: &[70, 1], kv_heads: 2, gqa: 7, d: 64, t: 1, bs: 16, width: 8, window: None, softcap: None },
        Paged { lens: &[90, 200], kv_heads: 1, gqa: 4, d: 256, t: 1, bs: 16, width: 16, window: Some(50), softcap: Some(50.0) },
        Paged { lens: &[33], kv_heads: 4, gqa: 8, d: 128, t: 1, bs: 16, width: 4, window: None, softcap: None },
        // Groups of 8 in a batched step (on CUDA: two blocks of 4 heads a kv head), 64 channels.
        Paged { lens: &[150, 3, 64], kv_heads: 2, gqa: 8, d: 64, t: 1, bs: 16, width: 12, window: None, softcap: None },
        // A batched step of 16 rows (on CUDA: 128 groups take splits longer than 32 keys).
        Paged { lens: &[320, 17, 200, 64, 1, 300, 129, 250, 33, 310, 96, 160, 5, 288, 77, 240], kv_heads: 8, gqa: 4, d: 128, t: 1, bs: 16, width: 20, window: None, softcap: None },
    ];
    for a in &variants {
        for &dt in &FLOATS {
            let (b, hkv, hq, t, d, bs) = (a.lens.len(), a.kv_heads, a.kv_heads * a.gqa, a.t, a.d, a.bs);
            let mut name = format!("paged_attention/{dt}/b{b}/gqa{}/d{d}/t{t}/bs{bs}", a.gqa);
            if let Some(w) = a.window {
                name += &format!("/window{w}");
            }
            if a.softcap.is_some() {
                name += "/softcap";
            }
            let mut c = Case::new(name);
            // Block 0 is never lent; row r's j-th block is a shuffled pick of the rest.
            let blocks = 1 + b * a.width;
            let mut order: Vec<usize> = (1..blocks).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, (i * 7 + 3) % (i + 1));
            }
            let mut table = vec![0.0f32; b * a.width];
            let mut slots = Vec::new();
            for (r, &len) in a.lens.iter().enumerate() {
                for j in 0..len.div_ceil(bs) {
                    table[r * a.width + j] = order[r * a.width + j] as f32;
                }
                for pos in len - t..len {
                    slots.push(table[r * a.width + pos / bs] * bs as f32 + (pos % bs) as f32);
                }
            }
            let pool = [1, 1, blocks * bs, hkv * d];
            let k_pool = c.state("k_pool", dt, &pool)?;
            let v_pool = c.state("v_pool", dt, &pool)?;
            let q = c.input("q", dt, &[b, hq, t, d], 4.0)?;
            let k_new = c.input("k", dt, &[1, 1, b * t, hkv * d], 1.0)?;
            let v_new = c.input("v", dt, &[1, 1, b * t, hkv * d], 1.0)?;
            let slots = c.input_values("slots", I32, &[1, b * t], &slots)?;
            let k_all = c.b.kv_write(k_pool, k_new, slots)?;
            let v_all = c.b.kv_write(v_pool, v_new, slots)?;
            let k_all = c.b.reshape(k_all, &[blocks * bs, hkv, d])?;
            let v_all = c.b.reshape(v_all, &[blocks * bs, hkv, d])?;
            let lens: Vec<f32> = a.lens.iter().map(|&l| l as f32).collect();
            let kv_len = c.input_values("kv_len", I32, &[b], &lens)?;
            let table = c.input_values("table", I32, &[b, a.width], &table)?;
            let scale = 1.0 / (d as f32).sqrt();
            let y =
                c.b.paged_attention(q, k_all, v_all, kv_len, table, bs, scale, true, a.window, a.softcap)?;
            cases.push(c.finish(&[y], 2.0));
        }
    }
    Ok(())
}

fn kv_write(cases: &mut Vec<OpCase>) -> Result<()> {
    for &dt in &FLOATS {
        // The second row writes the last three slots exactly.
        let mut c = Case::new(format!("kv_write/{dt}/b2/t3/pos_per_batch"));
        let cache = c.state("cache", dt, &[2, 2, 12, 32])?;
        let new = c.input("new", dt, &[2, 2, 3, 32], 1.0)?;
        let pos = c.input_values("pos", I32, &[2], &[0.0, 9.0])?;
        let y = c.b.kv_write(cache, new, pos)?;
        cases.push(c.finish(&[y], BIT_EXACT));
    }
    // A slot a token (pos [B, T]), as the paged pool writes: tokens in no order, one at the
    // last slot, and two rows of a batch.
    for &dt in &FLOATS {
        for (b, h, t, cap, slots) in [
            (1usize, 1usize, 5usize, 20usize, &[7.0f32, 0.0, 19.0, 3.0, 12.0][..]),
            (2, 2, 3, 12, &[0.0, 5.0, 11.0, 9.0, 2.0, 4.0][..]),
            // pos [B, 1]: one token a row, where the per-token and per-row forms agree.
            (2, 1, 1, 6, &[5.0, 2.0][..]),
        ] {
            let mut c = Case::new(format!("kv_write/{dt}/b{b}/t{t}/slot_per_token"));
            let cache = c.state("cache", dt, &[b, h, cap, 16])?;
            let new = c.input("new", dt, &[b, h, t, 16], 1.0)?;
            let pos = c.input_values("pos", I32, &[b, t], slots)?;
            let y = c.b.kv_write(cache, new, pos)?;
            cases.push(c.finish(&[y], BIT_EXACT));
        }
    }
    // Rotated keys written into the cache (one kernel on CUDA): decode (T = 1) and a chunk.
    for &dt in &FLOATS {
        for (t, at) in [(1usize, 7.0f32), (3, 4.0)] {
            let mut c = Case::new(format!("kv_write/{dt}/of_rope/t{t}"));
            let cache = c.state("cache", dt, &[1, 2, 10, 32])?;
            let k = c.input("k", dt, &[1, 2, t, 32], 1.0)?;
            let positions: Vec<f32> = (0..t).map(|i| at + i as f32).collect();
            let positions = c.input_values("positions", I32, &[t], &positions)?;
            let freqs = inv_freq(&mut c, 32)?;
            let k = c.b.rope(k, positions, freqs, 32, false, 1.0)?;
            let pos = c.input_values("pos", I32, &[], &[at])?;
            let y = c.b.kv_write(cache, k, pos)?;
            let factor = if dt == F32 { 4.0 } else { 1.0 };
            cases.push(c.finish(&[y], factor));
        }
    }
    {
        let mut c = Case::new("kv_write/f16_cache/f32_new/pos_scalar/d33".into());
        let cache = c.state("cache", F16, &[1, 2, 10, 33])?;
        let new = c.input("new", F32, &[1, 2, 2, 33], 1.0)?;
        let pos = c.input_values("pos", U32, &[], &[4.0])?;
        let y = c.b.kv_write(cache, new, pos)?;
        cases.push(c.finish(&[y], BIT_EXACT));
    }
    {
        let mut c = Case::new("kv_write/bf16/two_chained_writes".into());
        let cache = c.state("cache", BF16, &[1, 1, 9, 32])?;
        let first = c.input("first", BF16, &[1, 1, 3, 32], 1.0)?;
        let second = c.input("second", BF16, &[1, 1, 2, 32], 1.0)?;
        let p1 = c.input_values("pos1", I32, &[], &[2.0])?;
        let p2 = c.input_values("pos2", I32, &[], &[4.0])?; // overwrites the last slot of the first
        let w1 = c.b.kv_write(cache, first, p1)?;
        let w2 = c.b.kv_write(w1, second, p2)?;
        cases.push(c.finish(&[w2], BIT_EXACT));
    }
    {
        // A cache no initial value was given for starts at zero.
        let mut c = Case::new("kv_write/f32/zero_initial_state".into());
        let cache = c.b.state("cache", F32, &[1, 2, 6, 31]);
        let new = c.input("new", F32, &[1, 2, 1, 31], 1.0)?;
        let pos = c.input_values("pos", I32, &[1], &[3.0])?;
        let y = c.b.kv_write(cache, new, pos)?;
        cases.push(c.finish(&[y], BIT_EXACT));
    }
    Ok(())
}

// ---- layout ----

fn layout(cases: &mut Vec<OpCase>) -> Result<()> {
    let transposes: [(DType, Shape, Shape); 5] = [
        (F32, &[2, 3, 5, 7], &[0, 2, 1, 3]),
        (F16, &[31, 33], &[1, 0]),
        (BF16, &[2, 3, 4], &[2, 0, 1]),
        (I32, &[3, 1, 5, 2], &[3, 0, 2, 1]),
        (U32, &[4, 5, 6], &[1, 2, 0]),
    ];
    for (dt, shape, perm) in transposes {
        let mut c = Case::new(format!("transpose/{dt}/{}/perm{}", dims(shape), list(perm)));
        let x = if dt.is_float() {
            c.input("x", dt, shape, 1.0)?
        } else {
            c.ints("x", dt, shape, 0, 1000)?
        };
        let y = c.b.transpose(x, perm)?;
        cases.push(c.finish(&[y], BIT_EXACT));
    }
    let slices: [(DType, Shape, Shape, Shape, Shape); 4] = [
        (F32, &[5, 33], &[1, 0], &[4, 33], &[1, 2]),
        (BF16, &[4, 9, 7], &[0, 2, 1], &[4, 9, 7], &[2, 3, 2]),
        (I32, &[33], &[7], &[33], &[5]),
        (F16, &[2, 3, 32], &[1, 0, 8], &[2, 3, 24], &[1, 1, 1]),
    ];
    for (dt, shape, start, end, step) in slices {
        let mut c = Case::new(format!(
            "slice/{dt}/{}/from{}/to{}/step{}",
            dims(shape),
            list(start),
            list(end),
            list(step)
        ));
        let x = if dt.is_float() {
            c.input("x", dt, shape, 1.0)?
        } else {
            c.ints("x", dt, shape, 0, 1000)?
        };
        let y = c.b.slice(x, start, end, step)?;
        cases.push(c.finish(&[y], BIT_EXACT));
    }
    let concats: [(&[DType], &[Shape], isize); 4] = [
        (&[F32, F32, F32], &[&[3, 31], &[3, 1], &[3, 33]], 1),
        (&[F16, F16], &[&[2, 33], &[5, 33]], 0),
        (&[F16, F32], &[&[2, 3, 4], &[2, 2, 4]], 1), // promotes the f16 part to f32
        (&[I32, I32], &[&[2, 3, 4], &[2, 3, 1]], -1),
    ];
    for (dtypes, shapes, axis) in concats {
        let mut c = Case::new(format!(
            "concat/{}/{}/axis{axis}",
            dtypes.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("+"),
            shapes.iter().map(|s| dims(s)).collect::<Vec<_>>().join("+")
        ));
        let mut parts = Vec::new();
        for (i, (&dt, &shape)) in dtypes.iter().zip(shapes).enumerate() {
            let name = format!("part{i}");
            parts.push(if dt.is_float() {
                c.input(&name, dt, shape, 1.0)?
            } else {
                c.ints(&name, dt, shape, 0, 1000)?
            });
        }
        let y = c.b.concat(&parts, axis)?;
        cases.push(c.finish(&[y], BIT_EXACT));
    }
    let broadcasts: [(DType, Shape, Shape); 4] = [
        (F32, &[3, 1, 5], &[3, 4, 5]),
        (F16, &[33], &[4, 33]), // adds a leading axis by reshape first
        (I32, &[1, 1], &[3, 31]),
        (BF16, &[2, 1, 1, 32], &[2, 3, 5, 32]),
    ];
    for (dt, from, to) in broadcasts {
        let mut c = Case::new(format!("broadcast/{dt}/{}_to_{}", dims(from), dims(to)));
        let x = if dt.is_float() {
            c.input("x", dt, from, 1.0)?
        } else {
            c.ints("x", dt, from, 0, 1000)?
        };
        let y = c.b.broadcast_to(x, to)?;
        cases.push(c.finish(&[y], BIT_EXACT));
    }
    for dt in [F32, F16] {
        let mut c = Case::new(format!("reshape/{dt}/input_as_output"));
        let x = c.input("x", dt, &[2, 3, 11], 1.0)?;
        let y = c.b.reshape(x, &[6, 11])?;
        cases.push(c.finish(&[y], BIT_EXACT));
    }
    {
        let mut c = Case::new("reshape/bf16/between_ops".into());
        let x = c.input("x", BF16, &[4, 33], 1.0)?;
        let e = c.b.exp(x)?;
        let r = c.b.reshape(e, &[2, 2, 33])?;
        let y = c.b.sum(r, 1, false)?;
        cases.push(c.finish(&[y], 1.0));
    }
    Ok(())
}

// ---- sorting and sampling ----

fn sorting(cases: &mut Vec<OpCase>) -> Result<()> {
    for (i, &dt) in [F32, F16, BF16, I32].iter().enumerate() {
        let k = [1, 5, 33, 8][i];
        let mut c = Case::new(format!("topk/{dt}/n33/k{k}"));
        // Eighth steps: repeated values exercise the lower-index-first rule.
        let x = c.grid(dt, &[3, 33], -8, 8, if dt.is_float() { 0.125 } else { 1.0 })?;
        let x = c.input_tensor("x", x);
        let y = c.b.topk(x, k)?;
        cases.push(c.finish(&[y], 1.0));
        // The same rows, ties to the higher index (qwen3_moe's router).
        let mut c = Case::new(format!("topk/{dt}/n33/k{k}/higher_on_ties"));
        let x = c.grid(dt, &[3, 33], -8, 8, if dt.is_float() { 0.125 } else { 1.0 })?;
        let x = c.input_tensor("x", x);
        let y = c.b.topk_ties(x, k, true)?;
        cases.push(c.finish(&[y], 1.0));
    }
    // NaN above +inf, ties among both, either tie rule, and the sort.
    for high in [false, true] {
        let mut c = Case::new(format!("topk/f32/nan_and_inf/higher_on_ties_{high}"));
        let (nan, inf) = (f32::NAN, f32::INFINITY);
        let x = c.input_values("x", F32, &[2, 5], &[inf, nan, 1.0, nan, inf, 2.0, inf, -inf, inf, 2.0])?;
        let y = c.b.topk_ties(x, 4, high)?;
        let order = c.b.argsort(x, true)?;
        cases.push(c.finish(&[y, order], 1.0));
    }
    {
        let mut c = Case::new("topk/f32/rank3/n31/k4".into());
        let x = c.input("x", F32, &[2, 3, 31], 1.0)?;
        let y = c.b.topk(x, 4)?;
        cases.push(c.finish(&[y], 1.0));
    }
    for (i, &dt) in [F32, F16, BF16, I32].iter().enumerate() {
        for descending in [false, true] {
            let n = ODD[(i + usize::from(descending)) % 3];
            let dir = if descending { "descending" } else { "ascending" };
            let mut c = Case::new(format!("argsort/{dt}/n{n}/{dir}"));
            let x = c.grid(dt, &[3, n], -8, 8, if dt.is_float() { 0.125 } else { 1.0 })?;
            let x = c.input_tensor("x", x);
            let y = c.b.argsort(x, descending)?;
            cases.push(c.finish(&[y], 1.0));
        }
    }
    Ok(())
}

fn sampling(cases: &mut Vec<OpCase>) -> Result<()> {
    for (dt, batch, vocab, seed, counter) in [
        (F32, 1, 50, 1, 0),
        (F16, 2, 200, 7, 3),
        (BF16, 2, 100, 42, 12_345),
        (F32, 2, 200, 9, 77),
    ] {
        let mut c = Case::new(format!(
            "sample_categorical/{dt}/b{batch}/v{vocab}/seed{seed}/counter{counter}"
        ));
        let logits = c.input("logits", dt, &[batch, vocab], 3.0)?;
        let counter = c.input_values("counter", U32, &[], &[counter as f32])?;
        let y = c.b.sample_categorical(logits, counter, seed)?;
        cases.push(c.finish(&[y], 1.0));
    }
    Ok(())
}

// ---- small graphs for planners ----

fn graphs(cases: &mut Vec<OpCase>) -> Result<()> {
    for &dt in &FLOATS {
        cases.push(mlp_chain(dt)?);
        cases.push(rope_cache_attention(dt, false)?);
        cases.push(rope_cache_attention(dt, true)?);

        let mut c = Case::new(format!("graph/{dt}/several_outputs"));
        let x = c.input("x", dt, &[3, 33], 3.0)?;
        let p = c.b.softmax(x, -1)?;
        let i = c.b.argmax(x, -1)?;
        let s = c.b.sum(x, -1, true)?;
        cases.push(c.finish(&[p, i, s], 1.0));
    }
    {
        // The same node twice, and an input itself, among the outputs.
        let mut c = Case::new("graph/f32/repeated_output_and_input_as_output".into());
        let x = c.input("x", F32, &[2, 31], 1.0)?;
        let y = c.b.exp(x)?;
        cases.push(c.finish(&[y, x, y], 1.0));
    }
    {
        let mut c = Case::new("graph/f32/topk_take_along_axis_softmax".into());
        let x = c.input("x", F32, &[2, 33], 3.0)?;
        let idx = c.b.topk(x, 5)?;
        let top = c.b.take_along_axis(x, idx, -1)?;
        let p = c.b.softmax(top, -1)?;
        cases.push(c.finish(&[idx, p], 1.0));
    }
    Ok(())
}

/// Two residual layers of rms_norm → 4-bit gate/up projections → silu · up → dense down
/// projection: values a planner must keep alive across several ops.
fn mlp_chain(dt: DType) -> Result<OpCase> {
    let mut c = Case::new(format!("graph/{dt}/two_layer_mlp"));
    let mut h = c.input("x", dt, &[3, 64], 1.0)?;
    for layer in 0..2 {
        c.b.set_layer(Some(layer));
        let p = format!("layers.{layer}.mlp");
        let norm_w = c.param_in(&format!("layers.{layer}.norm.weight"), dt, &[64], 0.5, 1.5)?;
        let n = c.b.rms_norm(h, norm_w, 1e-5, false)?;
        c.b.name(n, "mlp_norm");
        let [gw, gs, gb] = c.quantized(&format!("{p}.gate_proj"), &[96], 64, (4, 32), dt)?;
        let [uw, us, ub] = c.quantized(&format!("{p}.up_proj"), &[96], 64, (4, 32), dt)?;
        let gate = c.b.quantized_matmul(n, gw, gs, gb, 4, 32)?;
        let up = c.b.quantized_matmul(n, uw, us, ub, 4, 32)?;
        let act = c.b.silu(gate)?;
        let act = c.b.mul(act, up)?;
        let down_w = c.param(&format!("{p}.down_proj.weight"), dt, &[64, 96], 0.1)?;
        let down = c.b.matmul_t(act, down_w)?;
        c.b.name(down, "mlp_out");
        h = c.b.add(h, down)?;
    }
    // Roundings of intermediates propagate through both layers: four times the default.
    Ok(c.finish(&[h], 4.0))
}

/// Rope on q and k, both written to caches, attention over them, the output projection; the
/// updated caches are outputs too. `prefill`: a prefill chunk as a model builds it (q, k and v
/// in the projections' layout [B, T, H, D], transposed to [B, H, T, D]; a real head size over two
/// query tiles at an offset; on CUDA the transposes are absorbed by the rope-and-write and
/// attention kernels); else three queries of 32 channels given as [B, H, T, D].
fn rope_cache_attention(dt: DType, prefill: bool) -> Result<OpCase> {
    let name = if prefill {
        "prefill_attention_layer"
    } else {
        "rope_kv_write_attention"
    };
    let mut c = Case::new(format!("graph/{dt}/{name}"));
    let (t, d, at, cap) = if prefill { (70, 64, 5, 96) } else { (3, 32, 6, 20) };
    let k_cache = c.state("k_cache", dt, &[1, 2, cap, d])?;
    let v_cache = c.state("v_cache", dt, &[1, 2, cap, d])?;
    let shape = |h: usize| if prefill { [1, t, h, d] } else { [1, h, t, d] };
    let q = c.input("q", dt, &shape(4), 2.0)?;
    let k = c.input("k", dt, &shape(2), 1.0)?;
    let v = c.input("v", dt, &shape(2), 1.0)?;
    let [q, k, v] = if prefill {
        [q, k, v].map(|x| c.b.transpose(x, &[0, 2, 1, 3]).expect("a 4-d transpose"))
    } else {
        [q, k, v]
    };
    let at_values: Vec<f32> = (at..at + t).map(|p| p as f32).collect();
    let positions = c.input_values("positions", I32, &[t], &at_values)?;
    let pos = c.input_values("pos", I32, &[], &[at as f32])?;
    let freqs = inv_freq(&mut c, d)?;
    let q = c.b.rope(q, positions, freqs, d, false, 1.0)?;
    let k = c.b.rope(k, positions, freqs, d, false, 1.0)?;
    let k_all = c.b.kv_write(k_cache, k, pos)?;
    let v_all = c.b.kv_write(v_cache, v, pos)?;
    let kv_len = c.b.add_scalar(pos, t as f32)?;
    let o =
        c.b.attention(q, k_all, v_all, kv_len, 1.0 / (d as f32).sqrt(), true, None, None)?;
    let o = c.b.transpose(o, &[0, 2, 1, 3])?;
    let o = c.b.reshape(o, &[1, t, 4 * d])?;
    let o_proj = c.param("o_proj.weight", dt, &[32, 4 * d], 0.1)?;
    let y = c.b.matmul_t(o, o_proj)?;
    // Rope, attention and a projection of 128 or more in sequence: four times the default.
    Ok(c.finish(&[y, k_all, v_all], 4.0))
}
