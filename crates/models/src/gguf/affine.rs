//! Lossless mapping of ggml blocks onto MLX's affine layout: 32-element groups, each
//! `w = q·scale + bias` with unsigned `q` packed low bits first into u32 words.
//!
//! Every mapping keeps ggml's f32 arithmetic: the product `q·scale` is exact in f32 in each case
//! (at most 11 + 6 + 5 significant bits), so `q·scale + bias` rounds once, where ggml rounds
//! once, to the same value.
//! - Q4_0 `d·(q − 8)` → 4-bit, scale d, bias −8d. Q8_0 `d·q` (signed) → 8-bit q + 128, scale d,
//!   bias −128d. Q5_0 `d·(q − 16)` → 8-bit (a 5-bit q fits), scale d, bias −16d.
//! - Q4_1 `d·q + m` → 4-bit, scale d, bias m; Q5_1 likewise in 8 bits.
//! - Q4_K/Q5_K sub-blocks `(d·sc)·q − dmin·m` → 4-/8-bit, scale d·sc, bias −dmin·m. These
//!   products need up to 17 bits, so they are exact in f32 scales but rarely in f16.
//!
//! Scales and biases are checked to be finite and exactly representable in the requested dtype;
//! the first that is not is an error, never a silent rounding. Q4_0, Q4_1, Q8_0, Q5_0 and Q5_1
//! always fit f16 (their d and m are f16, and multiplying by a power of two is exact) unless a
//! scale is so large that −128d overflows. Types with 16-element groups (Q2_K, Q3_K, Q6_K) have
//! no MLX group size and must be dequantized.

use anyhow::{bail, ensure, Result};
use half::{bf16, f16};
use mlxcel_core::{DType, HostTensor};

use super::types::{self, f16_at, GgmlType};
use super::{GgufFile, TensorInfo};

/// An MLX affine-quantized tensor: for a GGUF tensor of shape `[..outer, cols]`, `weight` is
/// u32 `[..outer, cols·bits/32]` and `scales`/`biases` are `[..outer, cols/32]`.
#[derive(Clone, Debug)]
pub struct MlxAffine {
    pub weight: HostTensor,
    pub scales: HostTensor,
    pub biases: HostTensor,
    pub bits: u32,
    pub group_size: usize,
}

pub const AFFINE_GROUP_SIZE: usize = 32;

/// Bits of the MLX form of `ty`, if it has an exact one.
pub fn affine_bits(ty: GgmlType) -> Option<u32> {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4_K => Some(4),
        GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q5_K => Some(8),
        _ => None,
    }
}

/// Calls `emit(quants, scale, bias)` for each 32-element group of one block, in order.
fn groups(ty: GgmlType, b: &[u8], emit: &mut impl FnMut(&[u8], f32, f32)) {
    let nibbles = |qs: &[u8]| -> [u8; 32] { std::array::from_fn(|i| (qs[i % 16] >> (4 * (i / 16))) & 0xf) };
    match ty {
        GgmlType::Q4_0 => {
            let d = f16_at(b, 0);
            emit(&nibbles(&b[2..18]), d, -8.0 * d);
        }
        GgmlType::Q4_1 => emit(&nibbles(&b[4..20]), f16_at(b, 0), f16_at(b, 2)),
        GgmlType::Q8_0 => {
            let d = f16_at(b, 0);
            let q: [u8; 32] = std::array::from_fn(|i| b[2 + i] ^ 0x80); // i8 + 128
            emit(&q, d, -128.0 * d);
        }
        GgmlType::Q5_0 => {
            let d = f16_at(b, 0);
            emit(&types::q5_quants(&b[2..6], &b[6..22]), d, -16.0 * d);
        }
        GgmlType::Q5_1 => emit(&types::q5_quants(&b[4..8], &b[8..24]), f16_at(b, 0), f16_at(b, 2)),
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let q = if ty == GgmlType::Q4_K {
                types::q4_k_quants(b)
            } else {
                types::q5_k_quants(b)
            };
            for (s, (d, m)) in types::k4_sub_blocks(b).into_iter().enumerate() {
                emit(&q[s * 32..(s + 1) * 32], d, -m);
            }
        }
        _ => unreachable!("{ty} has no affine form"),
    }
}

impl GgufFile {
    /// The tensor in MLX's affine layout, group size 32, with `scale_dtype` (f32, f16 or bf16)
    /// scales and biases, dequantizing to exactly the values of [`GgufFile::dequantize`].
    /// Q4_0, Q4_1 and Q8_0 (and Q5_0, Q5_1 as 8-bit) are exact in f16; Q4_K and Q5_K in f32.
    pub fn to_mlx_affine(&self, name: &str, scale_dtype: DType) -> Result<MlxAffine> {
        let t = self.tensor_info(name)?;
        let Some(bits) = affine_bits(t.ty) else {
            bail!(
                "{}: tensor {name:?} is {}, which has no exact MLX affine form \
                 (Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, Q4_K, Q5_K have); dequantize it instead",
                self.source,
                t.ty
            );
        };
        ensure!(
            matches!(scale_dtype, DType::F32 | DType::F16 | DType::BF16),
            "{}: MLX scales are float32, float16 or bfloat16, not {}",
            self.source,
            scale_dtype.name()
        );
        let per_word = 32 / bits as usize;
        let numel = t.numel();
        let mut packed = vec![0u32; numel / per_word];
        let mut scales = Vec::with_capacity(numel / AFFINE_GROUP_SIZE);
        let mut biases = Vec::with_capacity(numel / AFFINE_GROUP_SIZE);
        // Rows are whole blocks and carry no padding, so the flat element index alone places
        // each quant: element e of the tensor is element e mod cols of row e / cols.
        let mut e = 0usize;
        for block in self.tensor_bytes(name)?.chunks_exact(t.ty.block_bytes()) {
            groups(t.ty, block, &mut |q, scale, bias| {
                for &v in q {
                    packed[e / per_word] |= (v as u32) << ((e % per_word) as u32 * bits);
                    e += 1;
                }
                scales.push(scale);
                biases.push(bias);
            });
        }
        let (&cols, outer) = t.shape.split_last().expect("a quantized tensor has a row dimension");
        let shape = |last: usize| [outer, &[last]].concat();
        Ok(MlxAffine {
            weight: HostTensor::from_slice(&shape(cols * bits as usize / 32), &packed)?,
            scales: self.exact(t, &scales, "scale", scale_dtype, &shape(cols / AFFINE_GROUP_SIZE))?,
            biases: self.exact(t, &biases, "bias", scale_dtype, &shape(cols / AFFINE_GROUP_SIZE))?,
            bits,
            group_size: AFFINE_GROUP_SIZE,
        })
    }

    fn exact(&self, t: &TensorInfo, values: &[f32], what: &str, dtype: DType, shape: &[usize]) -> Result<HostTensor> {
        for (g, &v) in values.iter().enumerate() {
            let back = match dtype {
                DType::F16 => f16::from_f32(v).to_f32(),
                DType::BF16 => bf16::from_f32(v).to_f32(),
                _ => v,
            };
            ensure!(
                v.is_finite(),
                "{}: tensor {:?} ({}): the {what} of group {g} is {v}; a non-finite {what} has no exact affine form",
                self.source,
                t.name,
                t.ty
            );
            ensure!(
                back == v,
                "{}: tensor {:?} ({}): the {what} of group {g}, {v}, is not exact in {}{}",
                self.source,
                t.name,
                t.ty,
                dtype.name(),
                if dtype == DType::F32 {
                    ""
                } else {
                    " (ask for float32 scales)"
                }
            );
        }
        Ok(HostTensor::from_f32(dtype, shape, values)?)
    }
}
