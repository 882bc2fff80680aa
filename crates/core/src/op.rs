//! The op set. Each node's output dtype and shape live on the node; an op carries only what
//! its kernel needs beyond that.

use crate::tensor::HostTensor;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Tanh,
    Sigmoid,
    Silu,
    /// `0.5 x (1 + erf(x / √2))`
    GeluErf,
    /// `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`
    GeluTanh,
    /// `cap · tanh(x / cap)` (Gemma 2 logit soft-capping).
    Softcap(f32),
    Sin,
    Cos,
}

impl UnaryOp {
    /// Ops that MLX computes in floating point even for integer inputs (`at_least_float`).
    pub fn needs_float(self) -> bool {
        !matches!(self, UnaryOp::Neg | UnaryOp::Abs)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    /// True division: integer operands compute in f32, as in MLX.
    Div,
    Maximum,
    Minimum,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
    /// Index of the first maximum, as `u32`.
    ArgMax,
    LogSumExp,
}

#[derive(Clone, Debug)]
pub enum Op {
    // ---- leaves ----
    /// A weight: bytes fixed for the life of the graph.
    Parameter {
        name: String,
        data: HostTensor,
    },
    /// A small literal (scalars, frequency tables).
    Constant {
        data: HostTensor,
    },
    /// A value supplied on every run (token ids, positions, KV length).
    Input {
        name: String,
    },
    /// A persistent buffer that outlives a run (the KV cache), zero at first, shared by name
    /// between graphs of one session.
    State {
        name: String,
    },

    // ---- elementwise (all operands already share one dtype and shape) ----
    Unary(UnaryOp),
    Binary(BinaryOp),
    /// Output is `Bool`.
    Compare(CompareOp),
    /// `cond ? a : b`; inputs `[cond (bool), a, b]`.
    Where,
    /// Conversion to the node's dtype. The only op that changes dtype.
    AsType,

    // ---- reductions over one axis ----
    Reduce {
        op: ReduceOp,
        axis: usize,
        keepdims: bool,
    },
    Softmax {
        axis: usize,
    },
    /// Inclusive prefix sum along `axis`.
    CumSum {
        axis: usize,
        reverse: bool,
    },

    // ---- linear algebra (weight operands may be any float dtype: kernels widen on load) ----
    /// `a [.., M, K] @ b [.., K, N]`, or `b [.., N, K]` transposed. `b` may be rank 2 (shared).
    MatMul {
        transpose_b: bool,
    },
    /// `x [.., K] @ dequant(w)ᵀ` with inputs `[x, w (u32 [N, K·bits/32]), scales [N, K/g],
    /// biases [N, K/g]]`; MLX's layout: element `j` of a row sits in word `j·bits/32` at bit
    /// `(j mod 32/bits)·bits`, and `w = q·scale + bias` per group of `g` along K.
    QuantizedMatMul {
        bits: u32,
        group_size: usize,
    },
    /// MoE experts: inputs `[x [.., X, K], w [E, N, K·bits/32], scales [E, N, K/g], biases,
    /// ids [.., k]]` with `X` 1 (shared input) or `k`; output `[.., k, N]`.
    GatherQuantizedMatMul {
        bits: u32,
        group_size: usize,
    },

    // ---- fused NN ops ----
    /// `x · rsqrt(mean(x²) + eps) · w`, or `· (1 + w)` with `unit_offset` (Gemma).
    RmsNorm {
        eps: f32,
        unit_offset: bool,
    },
    /// Inputs `[x, weight?, bias?]` as flagged.
    LayerNorm {
        eps: f32,
        has_weight: bool,
        has_bias: bool,
    },
    /// Rotary embedding of `x [B, H, T, D]` at `positions` (`i32 [T]` or `[B, T]`) with
    /// `inv_freq [dims/2]`: angle = position · scale · `inv_freq[i]`. Half-split pairs
    /// `(i, i + dims/2)`, or interleaved pairs `(2i, 2i+1)`. Channels past `dims` pass through.
    Rope {
        dims: usize,
        interleaved: bool,
        scale: f32,
    },
    /// Scaled dot-product attention of `q [B, Hq, T, D]` over cached `k [B, Hkv, S, D]`,
    /// `v [B, Hkv, S, Dv]`, of which the first `kv_len` (`i32 []` or `[B]`) are valid; query `t`
    /// sits at position `kv_len - T + t`. GQA by `Hq / Hkv`.
    Attention {
        scale: f32,
        causal: bool,
        window: Option<usize>,
        softcap: Option<f32>,
    },
    /// [`Op::Attention`] over a paged pool: keys `k [P, Hkv, D]` and values `v [P, Hkv, Dv]`,
    /// one pool slot a row, and `table` (`i32 [B, M]`): row `b`'s position `j` lives at slot
    /// `table[b, j / block_size] · block_size + j % block_size`. Inputs `[q, k, v, kv_len,
    /// table]`; `kv_len` (`[]` or `[B]`) at most `M · block_size`.
    PagedAttention {
        scale: f32,
        causal: bool,
        window: Option<usize>,
        softcap: Option<f32>,
        block_size: usize,
    },
    /// Writes `new [B, H, T, D]` into the cache state `[B, H, S, D]` at position `pos`
    /// (`i32 []` or `[B]`: token `t` at `pos + t`), or each token at its own slot (`pos [B, T]`:
    /// a paged pool's scattered slots). Its value is the updated cache (same buffer).
    KvWrite,
    /// Embedding lookup: `table [V, D]`, `ids [..]` → `[.., D]`.
    Gather,
    /// Quantized embedding lookup: inputs `[w, scales, biases, ids]`.
    QuantizedGather {
        bits: u32,
        group_size: usize,
    },
    /// `out[.., i, ..] = x[.., idx[.., i, ..], ..]` along `axis`.
    TakeAlongAxis {
        axis: usize,
    },

    // ---- layout ----
    Reshape,
    Transpose {
        perm: Vec<usize>,
    },
    /// Static strided slice per axis: `start..end` by `step`.
    Slice {
        start: Vec<usize>,
        end: Vec<usize>,
        step: Vec<usize>,
    },
    Concat {
        axis: usize,
    },
    /// To the node's shape, numpy rules (the input has the same rank, size-1 axes stretch).
    Broadcast,

    // ---- sorting ----
    /// Indices (`u32`) of the `k` largest along the last axis, largest first; among equal
    /// values the lower index first, or the higher one with `higher_on_ties` (what MLX's
    /// `argpartition(p)[-k:]` keeps, as qwen3_moe's router uses it).
    TopK {
        k: usize,
        higher_on_ties: bool,
    },
    /// Stable sort indices (`u32`) along the last axis.
    ArgSort {
        descending: bool,
    },

    // ---- sampling ----
    /// Gumbel-max draw from `logits [B, V]`; inputs `[logits, counter (u32 [])]`. Noise comes
    /// from [`crate::rng`] keyed by `(seed, counter, row, column)`, so every backend draws alike.
    SampleCategorical {
        seed: u64,
    },
}

impl Op {
    /// Short name for statistics, DOT labels and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Parameter { .. } => "parameter",
            Op::Constant { .. } => "constant",
            Op::Input { .. } => "input",
            Op::State { .. } => "state",
            Op::Unary(u) => match u {
                UnaryOp::Neg => "neg",
                UnaryOp::Abs => "abs",
                UnaryOp::Exp => "exp",
                UnaryOp::Log => "log",
                UnaryOp::Sqrt => "sqrt",
                UnaryOp::Rsqrt => "rsqrt",
                UnaryOp::Tanh => "tanh",
                UnaryOp::Sigmoid => "sigmoid",
                UnaryOp::Silu => "silu",
                UnaryOp::GeluErf => "gelu",
                UnaryOp::GeluTanh => "gelu_tanh",
                UnaryOp::Softcap(_) => "softcap",
                UnaryOp::Sin => "sin",
                UnaryOp::Cos => "cos",
            },
            Op::Binary(b) => match b {
                BinaryOp::Add => "add",
                BinaryOp::Sub => "sub",
                BinaryOp::Mul => "mul",
                BinaryOp::Div => "div",
                BinaryOp::Maximum => "maximum",
                BinaryOp::Minimum => "minimum",
            },
            Op::Compare(c) => match c {
                CompareOp::Eq => "equal",
                CompareOp::Ne => "not_equal",
                CompareOp::Lt => "less",
                CompareOp::Le => "less_equal",
                CompareOp::Gt => "greater",
                CompareOp::Ge => "greater_equal",
            },
            Op::Where => "where",
            Op::AsType => "astype",
            Op::Reduce { op, .. } => match op {
                ReduceOp::Sum => "sum",
                ReduceOp::Max => "max",
                ReduceOp::Min => "min",
                ReduceOp::ArgMax => "argmax",
                ReduceOp::LogSumExp => "logsumexp",
            },
            Op::Softmax { .. } => "softmax",
            Op::CumSum { .. } => "cumsum",
            Op::MatMul { .. } => "matmul",
            Op::QuantizedMatMul { .. } => "quantized_matmul",
            Op::GatherQuantizedMatMul { .. } => "gather_qmm",
            Op::RmsNorm { .. } => "rms_norm",
            Op::LayerNorm { .. } => "layer_norm",
            Op::Rope { .. } => "rope",
            Op::Attention { .. } => "attention",
            Op::PagedAttention { .. } => "paged_attention",
            Op::KvWrite => "kv_write",
            Op::Gather => "gather",
            Op::QuantizedGather { .. } => "quantized_gather",
            Op::TakeAlongAxis { .. } => "take_along_axis",
            Op::Reshape => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::Slice { .. } => "slice",
            Op::Concat { .. } => "concat",
            Op::Broadcast => "broadcast",
            Op::TopK { .. } => "topk",
            Op::ArgSort { .. } => "argsort",
            Op::SampleCategorical { .. } => "sample_categorical",
        }
    }

    pub fn is_leaf(&self) -> bool {
        matches!(
            self,
            Op::Parameter { .. } | Op::Constant { .. } | Op::Input { .. } | Op::State { .. }
        )
    }

    /// Ops whose operands share the output's dtype and shape exactly.
    pub fn is_elementwise(&self) -> bool {
        matches!(
            self,
            Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Where | Op::AsType
        )
    }

    /// Ops whose bytes-in equal bytes-out, so a backend may alias input and output.
    pub fn is_view(&self) -> bool {
        matches!(self, Op::Reshape)
    }

    /// Ops with an effect beyond their value; never removed as dead.
    pub fn has_side_effect(&self) -> bool {
        matches!(self, Op::KvWrite)
    }

    /// Constant data for leaves that carry it.
    pub fn constant_data(&self) -> Option<&HostTensor> {
        match self {
            Op::Parameter { data, .. } | Op::Constant { data } => Some(data),
            _ => None,
        }
    }
}
