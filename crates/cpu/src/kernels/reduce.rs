//! Reductions, softmax and prefix sums over one axis. A tensor is seen as
//! `[outer, n, inner]` with the axis in the middle.

use mlxcel_core::{ReduceOp, Result};
use rayon::prelude::*;

use super::{dtype_mismatch, PAR_MIN};
use crate::buffer::{with_scratch, Float, In, Out};

type Dims = (usize, usize, usize);

/// Reduces `x [outer, n, inner]` to `[outer, inner]`.
pub fn reduce(op: ReduceOp, x: In, (outer, n, inner): Dims, mut out: Out) -> Result<()> {
    let at = |o: usize, k: usize, i: usize| x.get_f64((o * n + k) * inner + i);
    for o in 0..outer {
        for i in 0..inner {
            let dst = o * inner + i;
            match op {
                ReduceOp::ArgMax => {
                    let mut best = 0;
                    for k in 1..n {
                        if at(o, k, i) > at(o, best, i) {
                            best = k;
                        }
                    }
                    let Out::U32(d) = &mut out else {
                        return Err(dtype_mismatch("argmax"));
                    };
                    d[dst] = best as u32;
                }
                ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min | ReduceOp::LogSumExp => {
                    let v = reduce_values(op, (0..n).map(|k| at(o, k, i)));
                    store_scalar(&mut out, dst, v)?;
                }
            }
        }
    }
    Ok(())
}

/// Accumulates in f64: exact for our integer ranges, and the oracle can afford it.
fn reduce_values(op: ReduceOp, vals: impl Iterator<Item = f64> + Clone) -> f64 {
    match op {
        ReduceOp::Sum => vals.fold(0.0f64, |a, v| a + v),
        ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
        ReduceOp::LogSumExp => {
            let m = vals.clone().fold(f64::NEG_INFINITY, f64::max);
            if m == f64::NEG_INFINITY {
                return m;
            }
            m + vals.map(|v| (v - m).exp()).sum::<f64>().ln()
        }
        ReduceOp::ArgMax => unreachable!(),
    }
}

fn store_scalar(out: &mut Out, i: usize, v: f64) -> Result<()> {
    match out {
        Out::F32(d) => d[i] = v as f32,
        Out::F16(d) => d[i] = half::f16::from_f32(v as f32),
        Out::BF16(d) => d[i] = half::bf16::from_f32(v as f32),
        Out::I32(d) => d[i] = v as i64 as i32,
        Out::U32(d) => d[i] = v as i64 as u32,
        Out::U8(d) => d[i] = v as i64 as u8,
    }
    Ok(())
}

/// Softmax along the middle axis, in f32. Input and output share a dtype.
pub fn softmax(x: In, dims: Dims, out: Out) -> Result<()> {
    match (x, out) {
        (In::F32(x), Out::F32(o)) => softmax_typed(x, dims, o),
        (In::F16(x), Out::F16(o)) => softmax_typed(x, dims, o),
        (In::BF16(x), Out::BF16(o)) => softmax_typed(x, dims, o),
        _ => return Err(dtype_mismatch("softmax")),
    }
    Ok(())
}

fn softmax_typed<T: Float>(x: &[T], (outer, n, inner): Dims, out: &mut [T]) {
    let block = |(xs, os): (&[T], &mut [T])| {
        // One outer block `[n, inner]`; each of `inner` columns is one softmax.
        with_scratch(n, |row| {
            for i in 0..inner {
                for (k, r) in row.iter_mut().enumerate() {
                    *r = xs[k * inner + i].to_f32();
                }
                softmax_row(row);
                for (k, &r) in row.iter().enumerate() {
                    os[k * inner + i] = T::from_f32(r);
                }
            }
        })
    };
    if outer * n * inner >= PAR_MIN && outer > 1 {
        x.par_chunks(n * inner)
            .zip(out.par_chunks_mut(n * inner))
            .for_each(block);
    } else {
        x.chunks(n * inner).zip(out.chunks_mut(n * inner)).for_each(block);
    }
}

/// In place; a row of all `-inf` becomes all zero rather than NaN.
pub fn softmax_row(row: &mut [f32]) {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        row.fill(0.0);
        return;
    }
    let mut sum = 0.0;
    for r in row.iter_mut() {
        *r = (*r - m).exp();
        sum += *r;
    }
    let inv = 1.0 / sum;
    row.iter_mut().for_each(|r| *r *= inv);
}

/// Inclusive prefix sum along the middle axis; floats accumulate in f32.
pub fn cumsum(x: In, (outer, n, inner): Dims, reverse: bool, mut out: Out) -> Result<()> {
    let float = matches!(x, In::F32(_) | In::F16(_) | In::BF16(_));
    for o in 0..outer {
        for i in 0..inner {
            let (mut accf, mut acci) = (0.0f32, 0i64);
            for step in 0..n {
                let k = if reverse { n - 1 - step } else { step };
                let idx = (o * n + k) * inner + i;
                let v = x.get_f64(idx);
                let total = if float {
                    accf += v as f32;
                    accf as f64
                } else {
                    acci = acci.wrapping_add(v as i64);
                    acci as f64
                };
                store_scalar(&mut out, idx, total)?;
            }
        }
    }
    Ok(())
}
