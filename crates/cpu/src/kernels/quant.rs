//! MLX affine-quantized matmul (decode: fused dequantize-dot; prefill: dequantized tiles into
//! f32 GEMM), its gathered MoE form, and quantized embedding rows.
//!
//! Per group of `g` weights along K: `Σ (q·s + b)·x = s·Σ q·x + b·Σ x`, so the inner loop
//! touches only the packed integers and the activations.

use mlxcel_core::{Error, Result};
use rayon::prelude::*;

use super::matmul::sgemm_abt;
use crate::buffer::{with_scratch, In, Out};

/// A packed weight `[.., N, K·bits/32]` with its scales and biases `[.., N, K/g]`.
pub struct QWeight<'a> {
    packed: &'a [u32],
    scales: In<'a>,
    biases: In<'a>,
    /// Rows per matrix (N) and matrices (E for experts, 1 otherwise).
    n: usize,
    mats: usize,
    k: usize,
    bits: u32,
    group: usize,
}

impl<'a> QWeight<'a> {
    pub fn new(packed: &'a [u8], scales: In<'a>, biases: In<'a>, shape: &[usize], bits: u32, group: usize) -> Self {
        let words = shape[shape.len() - 1];
        let n = shape[shape.len() - 2];
        let mats = shape[..shape.len() - 2].iter().product();
        let k = words * 32 / bits as usize;
        QWeight {
            packed: bytemuck::cast_slice(packed),
            scales,
            biases,
            n,
            mats,
            k,
            bits,
            group,
        }
    }

    fn words_per_row(&self) -> usize {
        self.k * self.bits as usize / 32
    }

    /// Row `r` (over all matrices) dequantized into `dst [K]`.
    fn dequantize_row(&self, r: usize, dst: &mut [f32]) {
        let wpr = self.words_per_row();
        let row = &self.packed[r * wpr..(r + 1) * wpr];
        let groups = self.k / self.group;
        for (j, d) in dst.iter_mut().enumerate() {
            let g = r * groups + j / self.group;
            let q = mlxcel_core::quant::unpack(row, j, self.bits) as f32;
            *d = q * self.scales.get_f64(g) as f32 + self.biases.get_f64(g) as f32;
        }
    }

    /// `res [N] = dequant(matrix e) @ x` for one activation row `x [K]` with per-group sums
    /// `xsum [K/g]`.
    fn matvec(&self, e: usize, x: &[f32], xsum: &[f32], res: &mut [f32]) {
        let wpr = self.words_per_row();
        let groups = self.k / self.group;
        let gw = self.group * self.bits as usize / 32; // words per group
        const CHUNK: usize = 16;
        res.par_chunks_mut(CHUNK).enumerate().for_each(|(c, out)| {
            for (j, o) in out.iter_mut().enumerate() {
                let r = e * self.n + c * CHUNK + j;
                let row = &self.packed[r * wpr..(r + 1) * wpr];
                let mut acc = 0.0f32;
                for g in 0..groups {
                    let words = &row[g * gw..(g + 1) * gw];
                    let xs = &x[g * self.group..(g + 1) * self.group];
                    let qx = match self.bits {
                        2 => qdot::<2>(words, xs),
                        4 => qdot::<4>(words, xs),
                        _ => qdot::<8>(words, xs),
                    };
                    let s = self.scales.get_f64(r * groups + g) as f32;
                    let b = self.biases.get_f64(r * groups + g) as f32;
                    acc += s * qx + b * xsum[g];
                }
                *o = acc;
            }
        });
    }

    fn group_sums(&self, x: &[f32], xsum: &mut [f32]) {
        for (g, s) in xsum.iter_mut().enumerate() {
            *s = x[g * self.group..(g + 1) * self.group].iter().sum();
        }
    }
}

/// `Σ q_j · x_j` over the packed words of one group.
#[inline]
fn qdot<const BITS: u32>(words: &[u32], x: &[f32]) -> f32 {
    let per = (32 / BITS) as usize;
    let mask = (1u32 << BITS) - 1;
    let mut acc = 0.0f32;
    for (w, xs) in words.iter().zip(x.chunks_exact(per)) {
        let mut part = 0.0f32;
        for (i, &xv) in xs.iter().enumerate() {
            part += ((w >> (i as u32 * BITS)) & mask) as f32 * xv;
        }
        acc += part;
    }
    acc
}

/// Rows of activations up to which the fused dequantize-dot path is used.
const QMV_MAX_ROWS: usize = 4;
const TILE_N: usize = 256;

/// `out [M, N] = x [M, K] @ dequant(w)ᵀ`.
pub fn qmm(x: In, q: &QWeight, mut out: Out) -> Result<()> {
    let (k, n) = (q.k, q.n);
    let m = x.len() / k;
    if m <= QMV_MAX_ROWS {
        with_scratch(k + k / q.group + n, |s| {
            let (row, rest) = s.split_at_mut(k);
            let (xsum, res) = rest.split_at_mut(k / q.group);
            for r in 0..m {
                x.load_f32(r * k, row);
                q.group_sums(row, xsum);
                q.matvec(0, row, xsum, res);
                out.store_f32(r * n, res);
            }
        });
        return Ok(());
    }
    let tile = TILE_N.min(n);
    with_scratch(m * k + tile * k + m * tile, |s| {
        let (x32, rest) = s.split_at_mut(m * k);
        let (w32, c32) = rest.split_at_mut(tile * k);
        x.load_f32(0, x32);
        let mut n0 = 0;
        while n0 < n {
            let tn = tile.min(n - n0);
            w32[..tn * k]
                .par_chunks_mut(k)
                .enumerate()
                .for_each(|(j, dst)| q.dequantize_row(n0 + j, dst));
            sgemm_abt(x32, &w32[..tn * k], &mut c32[..m * tn], m, k, tn);
            for r in 0..m {
                out.store_f32(r * n + n0, &c32[r * tn..(r + 1) * tn]);
            }
            n0 += tn;
        }
    });
    Ok(())
}

/// `out [R, k, N]`: for each of the `R·k` (token, slot) pairs, expert `ids[r, j]` applied to
/// `x [R, X, K]` row `j` (or row 0 when X = 1).
pub fn gather_qmm(x: In, sx: &[usize], q: &QWeight, ids: In, sids: &[usize], mut out: Out) -> Result<()> {
    let (k, n) = (q.k, q.n);
    let top = *sids.last().unwrap();
    let x_rows = sx[sx.len() - 2];
    let pairs = ids.len();
    with_scratch(k + k / q.group + n, |s| {
        let (row, rest) = s.split_at_mut(k);
        let (xsum, res) = rest.split_at_mut(k / q.group);
        for p in 0..pairs {
            let e = ids.get_index(p)?;
            if e < 0 || e as usize >= q.mats {
                return Err(Error::Runtime(format!("expert id {e} is outside 0..{}", q.mats)));
            }
            let (t, j) = (p / top, p % top);
            let xr = t * x_rows + if x_rows == 1 { 0 } else { j };
            x.load_f32(xr * k, row);
            q.group_sums(row, xsum);
            q.matvec(e as usize, row, xsum, res);
            out.store_f32(p * n, res);
        }
        Ok(())
    })
}

/// Quantized embedding: `out [.., D]` rows `ids` of the table, dequantized.
pub fn gather_rows(q: &QWeight, ids: In, mut out: Out) -> Result<()> {
    let d = q.k;
    with_scratch(d, |row| {
        for p in 0..ids.len() {
            let id = ids.get_index(p)?;
            if id < 0 || id as usize >= q.n {
                return Err(Error::Runtime(format!(
                    "token id {id} is outside the vocabulary 0..{}",
                    q.n
                )));
            }
            q.dequantize_row(id as usize, row);
            out.store_f32(p * d, row);
        }
        Ok(())
    })
}
