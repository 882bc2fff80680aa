//! RMSNorm and LayerNorm over the last axis, in f32.

use mlxcel_core::Result;

use crate::buffer::{with_scratch, In, Out};

/// `out = x · rsqrt(mean(x²) + eps) · w` (or `· (1 + w)`), row by row.
pub fn rms_norm(x: In, w: In, eps: f32, unit_offset: bool, mut out: Out) -> Result<()> {
    let d = w.len();
    with_scratch(2 * d, |s| {
        let (row, wf) = s.split_at_mut(d);
        w.load_f32(0, wf);
        if unit_offset {
            wf.iter_mut().for_each(|v| *v += 1.0);
        }
        for r in 0..x.len() / d {
            x.load_f32(r * d, row);
            let ms = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
            let inv = 1.0 / (ms + eps).sqrt();
            row.iter_mut().zip(wf.iter()).for_each(|(v, w)| *v = *v * inv * w);
            out.store_f32(r * d, row);
        }
    });
    Ok(())
}

/// `out = (x - mean) · rsqrt(var + eps) · w + b`, with `w` and `b` optional.
pub fn layer_norm(x: In, d: usize, w: Option<In>, b: Option<In>, eps: f32, mut out: Out) -> Result<()> {
    with_scratch(3 * d, |s| {
        let (row, rest) = s.split_at_mut(d);
        let (wf, bf) = rest.split_at_mut(d);
        match w {
            Some(w) => w.load_f32(0, wf),
            None => wf.fill(1.0),
        }
        if let Some(b) = b {
            b.load_f32(0, bf);
        }
        for r in 0..x.len() / d {
            x.load_f32(r * d, row);
            let mean = row.iter().sum::<f32>() / d as f32;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
            let inv = 1.0 / (var + eps).sqrt();
            for ((v, w), b) in row.iter_mut().zip(wf.iter()).zip(bf.iter()) {
                *v = (*v - mean) * inv * w + b;
            }
            out.store_f32(r * d, row);
        }
    });
    Ok(())
}
