//! Unary, binary, compare, select. Operands share dtype and shape (the builder saw to it).

use rayon::prelude::*;

use mlxcel_core::{BinaryOp, CompareOp, Result, UnaryOp};

use super::{dtype_mismatch, PAR_MIN};
use crate::buffer::{Float, In, Int, Out};

/// erf in f64, then rounded: exact to f32 precision.
fn erf(x: f32) -> f32 {
    libm_erf(x as f64) as f32
}

/// erf via the complementary series / continued fraction, good to f32 precision.
fn libm_erf(x: f64) -> f64 {
    // Taylor series near 0, continued fraction for |x| ≥ 2.5.
    let ax = x.abs();
    let r = if ax < 2.5 {
        let mut term = ax;
        let mut sum = ax;
        let x2 = ax * ax;
        let mut n = 0.0;
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -x2 / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else {
        // erfc(x) = exp(-x²)/(x√π) · 1/(1 + 1/(2x²)/(1 + 2/(2x²)/(1 + ...)))
        let mut f = 0.0;
        for k in (1..60).rev() {
            f = (k as f64 / 2.0) / (ax + f);
        }
        1.0 - (-ax * ax).exp() / ((ax + f) * std::f64::consts::PI.sqrt())
    };
    r.copysign(x)
}

fn unary_f32(op: UnaryOp, x: f32) -> f32 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Silu => x / (1.0 + (-x).exp()),
        UnaryOp::GeluErf => 0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2)),
        UnaryOp::GeluTanh => {
            let c = (2.0 / std::f32::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
        }
        UnaryOp::Softcap(cap) => cap * (x / cap).tanh(),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
    }
}

fn map<S: Copy + Sync, D: Send>(src: &[S], dst: &mut [D], f: impl Fn(S) -> D + Sync) {
    if dst.len() >= PAR_MIN {
        dst.par_iter_mut().zip(src.par_iter()).for_each(|(d, &s)| *d = f(s));
    } else {
        dst.iter_mut().zip(src).for_each(|(d, &s)| *d = f(s));
    }
}

fn zip_map<S: Copy + Sync, D: Send>(a: &[S], b: &[S], dst: &mut [D], f: impl Fn(S, S) -> D + Sync) {
    if dst.len() >= PAR_MIN {
        dst.par_iter_mut()
            .zip(a.par_iter().zip(b.par_iter()))
            .for_each(|(d, (&x, &y))| *d = f(x, y));
    } else {
        dst.iter_mut()
            .zip(a.iter().zip(b))
            .for_each(|(d, (&x, &y))| *d = f(x, y));
    }
}

fn unary_float<T: Float>(op: UnaryOp, x: &[T], out: &mut [T]) {
    map(x, out, |v| T::from_f32(unary_f32(op, v.to_f32())));
}

fn unary_int<T: Int>(op: UnaryOp, x: &[T], out: &mut [T]) {
    map(x, out, |v| {
        T::from_i64(if op == UnaryOp::Neg {
            -v.to_i64()
        } else {
            v.to_i64().abs()
        })
    });
}

pub fn unary(op: UnaryOp, x: In, out: Out) -> Result<()> {
    match (x, out) {
        (In::F32(x), Out::F32(o)) => unary_float(op, x, o),
        (In::F16(x), Out::F16(o)) => unary_float(op, x, o),
        (In::BF16(x), Out::BF16(o)) => unary_float(op, x, o),
        (In::I32(x), Out::I32(o)) if !op.needs_float() => unary_int(op, x, o),
        // Only abs reaches here for unsigned types (the builder rejects negating them).
        (In::U32(x), Out::U32(o)) if op == UnaryOp::Abs => o.copy_from_slice(x),
        (In::U8(x), Out::U8(o)) if op == UnaryOp::Abs => o.copy_from_slice(x),
        _ => return Err(dtype_mismatch("unary op")),
    }
    Ok(())
}

/// Maximum and minimum propagate NaN, as MLX does.
fn binary_f32(op: BinaryOp, a: f32, b: f32) -> f32 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Maximum if a.is_nan() || b.is_nan() => f32::NAN,
        BinaryOp::Maximum => a.max(b),
        BinaryOp::Minimum if a.is_nan() || b.is_nan() => f32::NAN,
        BinaryOp::Minimum => a.min(b),
    }
}

fn binary_i64(op: BinaryOp, a: i64, b: i64) -> i64 {
    match op {
        BinaryOp::Add => a.wrapping_add(b),
        BinaryOp::Sub => a.wrapping_sub(b),
        BinaryOp::Mul => a.wrapping_mul(b),
        BinaryOp::Div => unreachable!("integer division computes in float"),
        BinaryOp::Maximum => a.max(b),
        BinaryOp::Minimum => a.min(b),
    }
}

fn binary_float<T: Float>(op: BinaryOp, a: &[T], b: &[T], out: &mut [T]) {
    zip_map(a, b, out, |x, y| T::from_f32(binary_f32(op, x.to_f32(), y.to_f32())));
}

fn binary_int<T: Int>(op: BinaryOp, a: &[T], b: &[T], out: &mut [T]) {
    zip_map(a, b, out, |x, y| T::from_i64(binary_i64(op, x.to_i64(), y.to_i64())));
}

pub fn binary(op: BinaryOp, a: In, b: In, out: Out) -> Result<()> {
    match (a, b, out) {
        (In::F32(a), In::F32(b), Out::F32(o)) => binary_float(op, a, b, o),
        (In::F16(a), In::F16(b), Out::F16(o)) => binary_float(op, a, b, o),
        (In::BF16(a), In::BF16(b), Out::BF16(o)) => binary_float(op, a, b, o),
        (In::I32(a), In::I32(b), Out::I32(o)) if op != BinaryOp::Div => binary_int(op, a, b, o),
        (In::U32(a), In::U32(b), Out::U32(o)) if op != BinaryOp::Div => binary_int(op, a, b, o),
        (In::U8(a), In::U8(b), Out::U8(o)) if op != BinaryOp::Div => binary_int(op, a, b, o),
        _ => return Err(dtype_mismatch("binary op")),
    }
    Ok(())
}

/// Compares in f64, which holds every value of every dtype exactly.
pub fn compare(op: CompareOp, a: In, b: In, out: Out) -> Result<()> {
    let Out::U8(o) = out else {
        return Err(dtype_mismatch("compare"));
    };
    let f = |x: f64, y: f64| match op {
        CompareOp::Eq => x == y,
        CompareOp::Ne => x != y,
        CompareOp::Lt => x < y,
        CompareOp::Le => x <= y,
        CompareOp::Gt => x > y,
        CompareOp::Ge => x >= y,
    };
    for (i, d) in o.iter_mut().enumerate() {
        *d = u8::from(f(a.get_f64(i), b.get_f64(i)));
    }
    Ok(())
}

/// `cond ? a : b`, element by element on raw bytes of `size` each.
pub fn select(cond: In, a: &[u8], b: &[u8], out: &mut [u8], size: usize) -> Result<()> {
    let In::U8(c) = cond else {
        return Err(dtype_mismatch("where"));
    };
    for (i, &c) in c.iter().enumerate() {
        let src = if c != 0 { a } else { b };
        out[i * size..(i + 1) * size].copy_from_slice(&src[i * size..(i + 1) * size]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::libm_erf;

    #[test]
    fn erf_matches_known_values() {
        // Values from Abramowitz & Stegun, table 7.1.
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.520_499_877_8),
            (1.0, 0.842_700_792_9),
            (2.0, 0.995_322_265_0),
            (3.0, 0.999_977_909_5),
        ] {
            assert!((libm_erf(x) - want).abs() < 1e-9, "erf({x}) = {}", libm_erf(x));
            assert!((libm_erf(-x) + want).abs() < 1e-9);
        }
    }
}
