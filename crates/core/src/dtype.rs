//! Element types and MLX's type-promotion rules.

use std::fmt;

/// Element type of a tensor. `Bool` is stored as one byte (0 or 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    Bool,
    U8,
    U32,
    I32,
    F16,
    BF16,
    F32,
}

impl DType {
    pub const ALL: [DType; 7] = [
        DType::Bool,
        DType::U8,
        DType::U32,
        DType::I32,
        DType::F16,
        DType::BF16,
        DType::F32,
    ];

    pub fn size(self) -> usize {
        match self {
            DType::Bool | DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::U32 | DType::I32 | DType::F32 => 4,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32)
    }

    pub fn is_integer(self) -> bool {
        matches!(self, DType::U8 | DType::U32 | DType::I32)
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "uint8",
            DType::U32 => "uint32",
            DType::I32 => "int32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
        }
    }

    /// Short name used in DOT labels and trace lines.
    pub fn short(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::U32 => "u32",
            DType::I32 => "i32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
        }
    }

    pub fn parse(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s || d.short() == s)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short())
    }
}

/// How two dtypes combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Promotion {
    To(DType),
    /// MLX promotes to a type mlxcel does not carry (uint32 with int32 gives int64).
    Unsupported(&'static str),
}

/// Options that change the promotion table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PromotionPolicy {
    /// MLX promotes bfloat16 with float32 to float32. With this set, the pair stays bfloat16, so
    /// f32 constants or f32 norm weights in a bf16 model do not widen the activations.
    pub bf16_wins_over_f32: bool,
}

use DType::{Bool as B, BF16 as BF, F16 as H, F32 as F, I32 as I, U32 as W, U8 as U};

const I64: Promotion = Promotion::Unsupported("int64");

const fn to(d: DType) -> Promotion {
    Promotion::To(d)
}

/// MLX's table (`mlx/dtype.cpp`) restricted to our dtypes; rows and columns in `DType::ALL` order.
/// Checked against `mlx.core` 0.32: `(zeros(1, a) + zeros(1, b)).dtype`.
const TABLE: [[Promotion; 7]; 7] = [
    //     bool      u8        u32       i32       f16       bf16      f32
    [to(B), to(U), to(W), to(I), to(H), to(BF), to(F)],     // bool
    [to(U), to(U), to(W), to(I), to(H), to(BF), to(F)],     // u8
    [to(W), to(W), to(W), I64, to(H), to(BF), to(F)],       // u32
    [to(I), to(I), I64, to(I), to(H), to(BF), to(F)],       // i32
    [to(H), to(H), to(H), to(H), to(H), to(F), to(F)],      // f16
    [to(BF), to(BF), to(BF), to(BF), to(F), to(BF), to(F)], // bf16
    [to(F), to(F), to(F), to(F), to(F), to(F), to(F)],      // f32
];

fn index(d: DType) -> usize {
    DType::ALL.iter().position(|&x| x == d).expect("every dtype is in ALL")
}

/// The dtype MLX gives `a op b`, under `policy`.
pub fn promote(a: DType, b: DType, policy: PromotionPolicy) -> Promotion {
    if policy.bf16_wins_over_f32 && matches!((a, b), (BF, F) | (F, BF)) {
        return to(BF);
    }
    TABLE[index(a)][index(b)]
}

/// Smallest floating type that holds `d` the way MLX's `at_least_float` does (ints become f32).
pub fn at_least_float(d: DType) -> DType {
    if d.is_float() {
        d
    } else {
        DType::F32
    }
}
