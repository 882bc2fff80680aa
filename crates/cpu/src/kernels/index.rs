//! Gathers, sorting and sampling.

use mlxcel_core::{Error, Result};

use super::dtype_mismatch;
use crate::buffer::{In, Out};

/// Rows of `table [V, D]` (raw elements of `size` bytes) at `ids`.
pub fn gather(table: &[u8], st: &[usize], ids: In, dst: &mut [u8], size: usize) -> Result<()> {
    let row = st[1] * size;
    for p in 0..ids.len() {
        let id = ids.get_index(p)?;
        if id < 0 || id as usize >= st[0] {
            return Err(Error::Runtime(format!(
                "token id {id} is outside the vocabulary 0..{}",
                st[0]
            )));
        }
        let id = id as usize;
        dst[p * row..(p + 1) * row].copy_from_slice(&table[id * row..(id + 1) * row]);
    }
    Ok(())
}

/// `x [outer, n, inner]`, `idx [outer, m, inner]` → `out [outer, m, inner]`.
pub fn take_along_axis(
    x: &[u8],
    (outer, n, inner): (usize, usize, usize),
    idx: In,
    m: usize,
    dst: &mut [u8],
    size: usize,
) -> Result<()> {
    for o in 0..outer {
        for j in 0..m {
            for i in 0..inner {
                let at = (o * m + j) * inner + i;
                let k = idx.get_index(at)?;
                if k < 0 || k as usize >= n {
                    return Err(Error::Runtime(format!("index {k} is outside 0..{n}")));
                }
                let src = (o * n + k as usize) * inner + i;
                dst[at * size..(at + 1) * size].copy_from_slice(&x[src * size..(src + 1) * size]);
            }
        }
    }
    Ok(())
}

/// Orders indices of one row by value, largest first (`descending`) or smallest first; ties
/// keep the lower index first, or the higher with `higher_on_ties`; NaN sorts as the largest
/// value, above +inf (as numpy and MLX sort it last).
fn sort_row(x: &In, base: usize, idx: &mut [u32], descending: bool, higher_on_ties: bool) {
    // NaN above everything, +inf included (as the reference and the CUDA kernels order it).
    let key = |i: u32| {
        let v = x.get_f64(base + i as usize);
        (v.is_nan(), if v.is_nan() { 0.0 } else { v })
    };
    idx.sort_by(|&a, &b| {
        let (ka, kb) = (key(a), key(b));
        let ord = if descending {
            kb.partial_cmp(&ka)
        } else {
            ka.partial_cmp(&kb)
        };
        let by_index = if higher_on_ties { b.cmp(&a) } else { a.cmp(&b) };
        ord.unwrap_or(std::cmp::Ordering::Equal).then(by_index)
    });
}

pub fn argsort(x: In, n: usize, descending: bool, out: Out) -> Result<()> {
    let Out::U32(o) = out else {
        return Err(dtype_mismatch("argsort"));
    };
    for (r, row) in o.chunks_mut(n).enumerate() {
        row.iter_mut().enumerate().for_each(|(i, v)| *v = i as u32);
        sort_row(&x, r * n, row, descending, false);
    }
    Ok(())
}

/// Indices of the `k` largest per row, largest first (ties as [`sort_row`]).
pub fn topk(x: In, n: usize, k: usize, higher_on_ties: bool, out: Out) -> Result<()> {
    let Out::U32(o) = out else {
        return Err(dtype_mismatch("topk"));
    };
    let mut idx: Vec<u32> = Vec::with_capacity(n);
    for (r, row) in o.chunks_mut(k).enumerate() {
        idx.clear();
        idx.extend(0..n as u32);
        sort_row(&x, r * n, &mut idx, true, higher_on_ties);
        row.copy_from_slice(&idx[..k]);
    }
    Ok(())
}

/// Gumbel-max: per row, `argmax_v logits[v] + gumbel(seed, counter, row, v)`.
pub fn sample_categorical(logits: In, shape: &[usize], counter: In, seed: u64, out: Out) -> Result<()> {
    let Out::U32(o) = out else {
        return Err(dtype_mismatch("sample_categorical"));
    };
    let v = shape[1];
    let counter = counter.get_index(0)? as u32;
    for (b, dst) in o.iter_mut().enumerate() {
        let mut best = (f32::NEG_INFINITY, 0u32);
        for j in 0..v {
            let l = logits.get_f64(b * v + j) as f32;
            if l == f32::NEG_INFINITY {
                continue;
            }
            let score = l + mlxcel_core::rng::gumbel(seed, counter, b as u32, j as u32);
            if score > best.0 {
                best = (score, j as u32);
            }
        }
        *dst = best.1;
    }
    Ok(())
}
