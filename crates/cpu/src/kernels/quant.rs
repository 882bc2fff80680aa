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
        let per = 32 / self.bits as usize;
        let mask = (1u32 << self.bits) - 1;
        for (g, out) in dst.chunks_mut(self.group).enumerate() {
            let s = self.scales.get_f64(r * groups + g) as f32;
            let b = self.biases.get_f64(r * groups + g) as f32;
            let words = &row[g * self.group / per..(g + 1) * self.group / per];
            for (w, o) in words.iter().zip(out.chunks_mut(per)) {
                for (i, d) in o.iter_mut().enumerate() {
                    *d = ((w >> (i as u32 * self.bits)) & mask) as f32 * s + b;
                }
            }
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
            let rows = RowJob {
                q: self,
                first: e * self.n + c * CHUNK,
                wpr,
                groups,
                gw,
                x,
                xsum,
            };
            rows.run(out);
        });
    }

    fn group_sums(&self, x: &[f32], xsum: &mut [f32]) {
        for (g, s) in xsum.iter_mut().enumerate() {
            *s = x[g * self.group..(g + 1) * self.group].iter().sum();
        }
    }
}

/// A run of output rows of one quantized matvec.
struct RowJob<'a, 'w> {
    q: &'a QWeight<'w>,
    first: usize,
    wpr: usize,
    groups: usize,
    gw: usize,
    x: &'a [f32],
    xsum: &'a [f32],
}

impl RowJob<'_, '_> {
    #[inline(always)]
    fn rows<const BITS: u32>(&self, out: &mut [f32]) {
        let q = self.q;
        let groups = self.groups;
        // This row's scales and biases, widened once (stack space for up to MAX_GROUPS).
        let (mut sb, mut bb) = ([0.0f32; MAX_GROUPS], [0.0f32; MAX_GROUPS]);
        for (j, o) in out.iter_mut().enumerate() {
            let r = self.first + j;
            let row = &q.packed[r * self.wpr..(r + 1) * self.wpr];
            let (s, b) = (&mut sb[..groups], &mut bb[..groups]);
            q.scales.load_f32(r * groups, s);
            q.biases.load_f32(r * groups, b);
            let mut acc = 0.0f32;
            for g in 0..groups {
                let words = &row[g * self.gw..(g + 1) * self.gw];
                let qx = qdot::<BITS>(words, &self.x[g * q.group..(g + 1) * q.group]);
                acc += s[g] * qx + b[g] * self.xsum[g];
            }
            *o = acc;
        }
    }

    #[inline(always)]
    fn dispatch(&self, out: &mut [f32]) {
        match self.q.bits {
            2 => self.rows::<2>(out),
            4 => self.rows::<4>(out),
            _ => self.rows::<8>(out),
        }
    }

    /// The same loop compiled for AVX2+FMA (the baseline x86-64 target lacks the variable
    /// shifts that vectorize the unpacking).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dispatch_avx2(&self, out: &mut [f32]) {
        self.dispatch(out)
    }

    fn run(&self, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU was just checked for both features.
            return unsafe { self.dispatch_avx2(out) };
        }
        self.dispatch(out)
    }
}

/// Groups per row held on the stack by the matvec (K up to 32768 at group 32).
const MAX_GROUPS: usize = 1024;

/// `Σ q_j · x_j` over the packed words of one group, 32 elements at a time: unpack into an
/// f32 run, then a plain f32 dot product the compiler vectorizes.
#[inline(always)]
fn qdot<const BITS: u32>(words: &[u32], x: &[f32]) -> f32 {
    let per = (32 / BITS) as usize;
    let mask = (1u32 << BITS) - 1;
    let mut acc = 0.0;
    for (ws, xs) in words.chunks_exact(BITS as usize).zip(x.chunks_exact(32)) {
        let mut q = [0.0f32; 32];
        for (w, qs) in ws.iter().zip(q.chunks_exact_mut(per)) {
            for (i, d) in qs.iter_mut().enumerate() {
                *d = ((w >> (i as u32 * BITS)) & mask) as f32;
            }
        }
        acc += super::matmul::dot_f32(&q, xs);
    }
    acc
}

/// Rows of activations up to which the fused dequantize-dot path is used.
const QMV_MAX_ROWS: usize = 4;
const TILE_N: usize = 256;

/// `out [M, N] = x [M, K] @ dequant(w)ᵀ`.
fn check_groups(q: &QWeight) -> Result<()> {
    if q.k / q.group > MAX_GROUPS {
        let op = format!(
            "quantized matmul with {} groups per row (> {MAX_GROUPS})",
            q.k / q.group
        );
        return Err(Error::Unsupported { backend: "cpu", op });
    }
    Ok(())
}

pub fn qmm(x: In, q: &QWeight, mut out: Out) -> Result<()> {
    check_groups(q)?;
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
    check_groups(q)?;
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
