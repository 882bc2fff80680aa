//! ggml tensor types: the block geometry of every type a GGUF file may hold (so any tensor's
//! bytes can be bounds-checked), and f32 decoders for the ones mlxcel reads. Each decoder follows
//! ggml's `dequantize_row_*` (ggml-quants.c) block layout and float evaluation order, so results
//! match ggml and gguf-py bit for bit.

use std::fmt;

use half::{bf16, f16};

/// A ggml tensor type, by its GGUF type id.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
}

use GgmlType::*;

/// `(type, GGUF id, elements per block, bytes per block)`, as ggml's type traits (gguf-py's
/// `GGML_QUANT_SIZES` agrees except for Q8_1, where it still has the old f32 `d`, `s`: ggml
/// asserts 36). Ids 4, 5, 31–33 and 36–38 belonged to types ggml has removed.
const TABLE: &[(GgmlType, u32, usize, usize)] = &[
    (F32, 0, 1, 4),
    (F16, 1, 1, 2),
    (Q4_0, 2, 32, 18),
    (Q4_1, 3, 32, 20),
    (Q5_0, 6, 32, 22),
    (Q5_1, 7, 32, 24),
    (Q8_0, 8, 32, 34),
    (Q8_1, 9, 32, 36),
    (Q2_K, 10, 256, 84),
    (Q3_K, 11, 256, 110),
    (Q4_K, 12, 256, 144),
    (Q5_K, 13, 256, 176),
    (Q6_K, 14, 256, 210),
    (Q8_K, 15, 256, 292),
    (IQ2_XXS, 16, 256, 66),
    (IQ2_XS, 17, 256, 74),
    (IQ3_XXS, 18, 256, 98),
    (IQ1_S, 19, 256, 50),
    (IQ4_NL, 20, 32, 18),
    (IQ3_S, 21, 256, 110),
    (IQ2_S, 22, 256, 82),
    (IQ4_XS, 23, 256, 136),
    (I8, 24, 1, 1),
    (I16, 25, 1, 2),
    (I32, 26, 1, 4),
    (I64, 27, 1, 8),
    (F64, 28, 1, 8),
    (IQ1_M, 29, 256, 56),
    (BF16, 30, 1, 2),
    (TQ1_0, 34, 256, 54),
    (TQ2_0, 35, 256, 66),
    (MXFP4, 39, 32, 17),
    (NVFP4, 40, 64, 36),
    (Q1_0, 41, 128, 18),
];

impl GgmlType {
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|e| e.1 == id).map(|e| e.0)
    }

    fn entry(self) -> &'static (GgmlType, u32, usize, usize) {
        TABLE.iter().find(|e| e.0 == self).expect("every GgmlType is in TABLE")
    }

    pub fn id(self) -> u32 {
        self.entry().1
    }

    /// Elements per block (1 for plain types).
    pub fn block_size(self) -> usize {
        self.entry().2
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.entry().3
    }

    /// True for the types [`dequantize`] decodes.
    pub fn can_dequantize(self) -> bool {
        matches!(
            self,
            F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q2_K | Q3_K | Q4_K | Q5_K | Q6_K
        )
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?} ({})", self.id())
    }
}

pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Decodes `bytes` (whole blocks of `ty`) to f32, appending to `out`. `None` for a type without
/// a decoder. Panics if `bytes` is not a whole number of blocks (callers size it from the type).
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut Vec<f32>) -> Option<()> {
    assert!(bytes.len().is_multiple_of(ty.block_bytes()), "{ty}: partial block");
    let decode: fn(&[u8], &mut Vec<f32>) = match ty {
        F32 => {
            out.extend(
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            );
            return Some(());
        }
        F16 => {
            out.extend(bytes.chunks_exact(2).map(|b| f16_at(b, 0)));
            return Some(());
        }
        BF16 => {
            out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()),
            );
            return Some(());
        }
        Q4_0 => q4_0,
        Q4_1 => q4_1,
        Q5_0 => q5_0,
        Q5_1 => q5_1,
        Q8_0 => q8_0,
        Q2_K => q2_k,
        Q3_K => q3_k,
        Q4_K => q4_k,
        Q5_K => q5_k,
        Q6_K => q6_k,
        _ => return None,
    };
    for block in bytes.chunks_exact(ty.block_bytes()) {
        decode(block, out);
    }
    Some(())
}

// In the 32-element types, element i < 16 is the low nibble of qs[i] and element i + 16 its high
// nibble; Q5 types keep bit 4 of element i in bit i of the u32 `qh`.

/// `{ f16 d; u8 qs[16] }`: w = d·(q − 8).
fn q4_0(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    out.extend(qs.iter().map(|&q| ((q & 0xf) as i32 - 8) as f32 * d));
    out.extend(qs.iter().map(|&q| ((q >> 4) as i32 - 8) as f32 * d));
}

/// `{ f16 d, m; u8 qs[16] }`: w = d·q + m.
fn q4_1(b: &[u8], out: &mut Vec<f32>) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qs = &b[4..20];
    out.extend(qs.iter().map(|&q| (q & 0xf) as f32 * d + m));
    out.extend(qs.iter().map(|&q| (q >> 4) as f32 * d + m));
}

/// The 5-bit quants of a Q5_0/Q5_1 block, 0..32, in element order.
pub(crate) fn q5_quants(qh: &[u8], qs: &[u8]) -> [u8; 32] {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut q = [0u8; 32];
    for j in 0..16 {
        q[j] = (qs[j] & 0xf) | (((qh >> j) & 1) << 4) as u8;
        q[j + 16] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4) as u8;
    }
    q
}

/// `{ f16 d; u8 qh[4]; u8 qs[16] }`: w = d·(q − 16).
fn q5_0(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    out.extend(
        q5_quants(&b[2..6], &b[6..22])
            .iter()
            .map(|&q| (q as i32 - 16) as f32 * d),
    );
}

/// `{ f16 d, m; u8 qh[4]; u8 qs[16] }`: w = d·q + m.
fn q5_1(b: &[u8], out: &mut Vec<f32>) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    out.extend(q5_quants(&b[4..8], &b[8..24]).iter().map(|&q| q as f32 * d + m));
}

/// `{ f16 d; i8 qs[32] }`: w = d·q.
fn q8_0(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    out.extend(b[2..34].iter().map(|&q| q as i8 as f32 * d));
}

/// `{ u8 scales[16]; u8 qs[64]; f16 d, dmin }`: 16 groups of 16; scales byte = min << 4 | scale;
/// 2-bit quants, each qs byte holding four elements 32 apart.
fn q2_k(b: &[u8], out: &mut Vec<f32>) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, min) = (f16_at(b, 80), f16_at(b, 82));
    let mut is = 0;
    for q in qs.chunks_exact(32) {
        for shift in [0, 2, 4, 6] {
            for half in q.chunks_exact(16) {
                let sc = scales[is];
                is += 1;
                let (dl, ml) = (d * (sc & 0xf) as f32, min * (sc >> 4) as f32);
                out.extend(half.iter().map(|&v| dl * ((v >> shift) & 3) as f32 - ml));
            }
        }
    }
}

/// `{ u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d }`: 16 groups of 16 with signed 6-bit
/// scales (low 4 bits in bytes 0..8, high 2 bits in bytes 8..12); a 2-bit quant minus 4 unless
/// its hmask bit is set.
fn q3_k(b: &[u8], out: &mut Vec<f32>) {
    let (hmask, qs, s) = (&b[0..32], &b[32..96], &b[96..108]);
    let d = f16_at(b, 108);
    let scale = |k: usize| {
        let low = if k < 8 { s[k] & 0xf } else { s[k - 8] >> 4 };
        let high = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
        (low | high << 4) as i32 - 32
    };
    let (mut is, mut m) = (0, 1u8);
    for q in qs.chunks_exact(32) {
        for shift in [0, 2, 4, 6] {
            for (h, half) in q.chunks_exact(16).enumerate() {
                let dl = d * scale(is) as f32;
                is += 1;
                for (l, &v) in half.iter().enumerate() {
                    let high = if hmask[h * 16 + l] & m != 0 { 0 } else { 4 };
                    out.push(dl * (((v >> shift) & 3) as i32 - high) as f32);
                }
            }
            m <<= 1;
        }
    }
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8) of a Q4_K/Q5_K
/// super-block from its 12 packed bytes.
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The (scale, min) of each 32-element sub-block of a Q4_K/Q5_K super-block, as ggml computes
/// them: w = scale·q − min.
pub(crate) fn k4_sub_blocks(b: &[u8]) -> [(f32, f32); 8] {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    std::array::from_fn(|j| {
        let (sc, m) = scale_min_k4(j, &b[4..16]);
        (d * sc as f32, dmin * m as f32)
    })
}

/// The 4-bit quants of a Q4_K super-block in element order: sub-blocks 2p and 2p + 1 are the low
/// and high nibbles of qs[32p..32p + 32].
pub(crate) fn q4_k_quants(b: &[u8]) -> [u8; 256] {
    let qs = &b[16..144];
    std::array::from_fn(|e| {
        let (s, l) = (e / 32, e % 32);
        (qs[s / 2 * 32 + l] >> (4 * (s % 2))) & 0xf
    })
}

/// The 5-bit quants of a Q5_K super-block: Q4_K's nibbles (at qs = bytes 48..176) plus bit 4 of
/// sub-block s's element l in bit s of qh[l].
pub(crate) fn q5_k_quants(b: &[u8]) -> [u8; 256] {
    let (qh, qs) = (&b[16..48], &b[48..176]);
    std::array::from_fn(|e| {
        let (s, l) = (e / 32, e % 32);
        let low = (qs[s / 2 * 32 + l] >> (4 * (s % 2))) & 0xf;
        low | ((qh[l] >> s) & 1) << 4
    })
}

/// `{ f16 d, dmin; u8 scales[12]; u8 qs[128] }`: eight sub-blocks of 32.
fn q4_k(b: &[u8], out: &mut Vec<f32>) {
    let subs = k4_sub_blocks(b);
    let q = q4_k_quants(b);
    out.extend(q.iter().enumerate().map(|(e, &q)| {
        let (d, m) = subs[e / 32];
        d * q as f32 - m
    }));
}

/// `{ f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128] }`.
fn q5_k(b: &[u8], out: &mut Vec<f32>) {
    let subs = k4_sub_blocks(b);
    let q = q5_k_quants(b);
    out.extend(q.iter().enumerate().map(|(e, &q)| {
        let (d, m) = subs[e / 32];
        d * q as f32 - m
    }));
}

/// `{ u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }`: 16 groups of 16, w = d·scale·(q − 32).
/// Each 128-element half takes 64 ql bytes (elements l and l + 64 share byte l, l + 32 and
/// l + 96 share byte l + 32) and 32 qh bytes (two bits for each of l, l + 32, l + 64, l + 96).
fn q6_k(b: &[u8], out: &mut Vec<f32>) {
    let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    for n in 0..2 {
        let (ql, qh, sc) = (&ql[n * 64..], &qh[n * 32..], &sc[n * 8..]);
        out.extend((0..128).map(|r| {
            let (k, l) = (r / 32, r % 32);
            let low = (ql[l + 32 * (k % 2)] >> (4 * (k / 2))) & 0xf;
            let q = (low | ((qh[l] >> (2 * k)) & 3) << 4) as i32 - 32;
            d * sc[2 * k + l / 16] as i8 as f32 * q as f32
        }));
    }
}
