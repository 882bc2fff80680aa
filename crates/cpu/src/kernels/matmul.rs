//! Dense matmul. Few rows (decode): row-parallel dot products reading the weight in its stored
//! dtype. Many rows (prefill): f32 GEMM from the `gemm` crate on tiles of the weight widened to
//! f32, so a bf16 weight is never copied whole.

use mlxcel_core::Result;
use rayon::prelude::*;

use crate::buffer::{with_scratch, Float, In, Out};

/// Rows of `a` up to which the dot-product path beats widening tiles for GEMM.
const GEMV_MAX_ROWS: usize = 4;
/// Weight rows (output columns) widened to f32 per GEMM tile.
const TILE_N: usize = 256;

/// Sum of `a[k] · b[k]` in f32 with eight lanes, so the compiler vectorizes it.
#[inline(always)]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let tail: f32 = ar.iter().zip(br).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// `Σ a[k] · b[k]`, widening `b` in stack-sized runs so the inner loop is plain f32.
#[inline]
pub fn dot<T: Float>(a: &[f32], b: &[T]) -> f32 {
    const RUN: usize = 256;
    let mut buf = [0.0f32; RUN];
    let mut acc = 0.0;
    for (x, y) in a.chunks(RUN).zip(b.chunks(RUN)) {
        let w = &mut buf[..y.len()];
        T::widen(y, w);
        acc += dot_f32(x, w);
    }
    acc
}

/// `out [batch, M, N] = a [batch, M, K] @ b`, with `b [K, N]` or, transposed, `[N, K]`; `b`
/// without batch axes is shared by every batch.
pub fn matmul(a: In, sa: &[usize], b: In, sb: &[usize], transpose_b: bool, mut out: Out) -> Result<()> {
    let (m, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
    let n = if transpose_b {
        sb[sb.len() - 2]
    } else {
        sb[sb.len() - 1]
    };
    let batch: usize = sa[..sa.len() - 2].iter().product();
    let b_batched = sb.len() > 2;
    for bi in 0..batch {
        let b_off = if b_batched { bi * k * n } else { 0 };
        let job = Job {
            a,
            a_off: bi * m * k,
            out_off: bi * m * n,
            m,
            k,
            n,
            transpose_b,
        };
        crate::float_view!(b, bs => job.run(&bs[b_off..b_off + k * n], &mut out), "matmul");
    }
    Ok(())
}

struct Job<'a> {
    a: In<'a>,
    a_off: usize,
    out_off: usize,
    m: usize,
    k: usize,
    n: usize,
    transpose_b: bool,
}

impl Job<'_> {
    fn run<T: Float>(&self, b: &[T], out: &mut Out) {
        let (m, k, n) = (self.m, self.k, self.n);
        if m <= GEMV_MAX_ROWS {
            with_scratch(k + n, |s| {
                let (row, res) = s.split_at_mut(k);
                for r in 0..m {
                    self.a.load_f32(self.a_off + r * k, row);
                    gemv(row, b, self.transpose_b, res);
                    out.store_f32(self.out_off + r * n, res);
                }
            });
            return;
        }
        let tile = TILE_N.min(n);
        with_scratch(m * k + tile * k + m * tile, |s| {
            let (a32, rest) = s.split_at_mut(m * k);
            let (b32, c32) = rest.split_at_mut(tile * k);
            self.a.load_f32(self.a_off, a32);
            let mut n0 = 0;
            while n0 < n {
                let tn = tile.min(n - n0);
                // b32 holds output columns n0..n0+tn as rows of K: [tn, K].
                for j in 0..tn {
                    for kk in 0..k {
                        let src = if self.transpose_b {
                            (n0 + j) * k + kk
                        } else {
                            kk * n + n0 + j
                        };
                        b32[j * k + kk] = b[src].to_f32();
                    }
                }
                sgemm_abt(a32, &b32[..tn * k], &mut c32[..m * tn], m, k, tn);
                for r in 0..m {
                    out.store_f32(self.out_off + r * n + n0, &c32[r * tn..(r + 1) * tn]);
                }
                n0 += tn;
            }
        });
    }
}

/// `res [N] = row [K] @ b`, b `[N, K]` (transposed) or `[K, N]`, parallel over N.
fn gemv<T: Float>(row: &[f32], b: &[T], transpose_b: bool, res: &mut [f32]) {
    let k = row.len();
    let n = res.len();
    const CHUNK: usize = 64;
    res.par_chunks_mut(CHUNK).enumerate().for_each(|(c, out)| {
        let n0 = c * CHUNK;
        if transpose_b {
            for (j, o) in out.iter_mut().enumerate() {
                *o = dot(row, &b[(n0 + j) * k..(n0 + j + 1) * k]);
            }
        } else {
            out.fill(0.0);
            for (kk, &x) in row.iter().enumerate() {
                let bs = &b[kk * n + n0..kk * n + n0 + out.len()];
                out.iter_mut().zip(bs).for_each(|(o, w)| *o += x * w.to_f32());
            }
        }
    });
}

/// `c [M, N] = a [M, K] @ bᵀ` with `b [N, K]`, all f32 row-major.
pub fn sgemm_abt(a: &[f32], b: &[f32], c: &mut [f32], m: usize, k: usize, n: usize) {
    assert!(a.len() >= m * k && b.len() >= n * k && c.len() >= m * n);
    // SAFETY: the asserts above bound every index gemm touches given these strides:
    // a (m×k, row stride k), bᵀ (k×n: element (kk, j) at j·k + kk), c (m×n, row stride n).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            k as isize,
            1,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(rayon::current_num_threads()),
        )
    }
}
