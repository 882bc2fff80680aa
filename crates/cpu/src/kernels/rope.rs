//! Rotary position embedding on `x [B, H, T, D]`.

use mlxcel_core::Result;

use crate::buffer::{with_scratch, In, Out};

/// Rotates the first `dims` channels of each row by `position · scale · inv_freq[i]`:
/// pairs `(i, i + dims/2)` (half-split, MLX's default) or `(2i, 2i + 1)` (interleaved).
#[allow(clippy::too_many_arguments)]
pub fn rope(
    x: In,
    sx: &[usize],
    positions: In,
    sp: &[usize],
    inv_freq: In,
    dims: usize,
    interleaved: bool,
    scale: f32,
    mut out: Out,
) -> Result<()> {
    let (b, h, t, d) = (sx[0], sx[1], sx[2], sx[3]);
    let half = dims / 2;
    let per_batch = sp.len() == 2;
    with_scratch(d + half, |s| {
        let (row, freq) = s.split_at_mut(d);
        inv_freq.load_f32(0, freq);
        for bi in 0..b {
            for ti in 0..t {
                let pos = positions.get_index(if per_batch { bi * t + ti } else { ti })? as f32;
                for hi in 0..h {
                    let off = ((bi * h + hi) * t + ti) * d;
                    x.load_f32(off, row);
                    for (i, f) in freq.iter().enumerate() {
                        let (sin, cos) = (pos * scale * f).sin_cos();
                        let (ia, ib) = if interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
                        let (a, c) = (row[ia], row[ib]);
                        row[ia] = a * cos - c * sin;
                        row[ib] = a * sin + c * cos;
                    }
                    out.store_f32(off, row);
                }
            }
        }
        Ok(())
    })
}
