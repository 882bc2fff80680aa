//! Transpose, slice, concat and broadcast: strided copies of raw elements.

/// Copies elements of `size` bytes: `dst` is contiguous in `shape`; element `idx` of it comes
/// from `src` at `offset + Σ idx[a]·strides[a]` (in elements).
fn strided_copy(src: &[u8], offset: usize, strides: &[usize], shape: &[usize], dst: &mut [u8], size: usize) {
    let n: usize = shape.iter().product();
    if n == 0 {
        return;
    }
    let rank = shape.len();
    let mut idx = vec![0usize; rank];
    let mut at = offset;
    for i in 0..n {
        dst[i * size..(i + 1) * size].copy_from_slice(&src[at * size..(at + 1) * size]);
        // Advance the multi-index like an odometer, keeping `at` in step.
        for a in (0..rank).rev() {
            idx[a] += 1;
            at += strides[a];
            if idx[a] < shape[a] {
                break;
            }
            at -= strides[a] * shape[a];
            idx[a] = 0;
        }
    }
}

/// Row-major strides (in elements) of `shape`.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for a in (0..shape.len().saturating_sub(1)).rev() {
        s[a] = s[a + 1] * shape[a + 1];
    }
    s
}

pub fn transpose(src: &[u8], shape: &[usize], perm: &[usize], dst: &mut [u8], size: usize) {
    let st = strides(shape);
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let out_strides: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
    strided_copy(src, 0, &out_strides, &out_shape, dst, size);
}

pub fn slice(src: &[u8], shape: &[usize], start: &[usize], step: &[usize], out: &[usize], dst: &mut [u8], size: usize) {
    let st = strides(shape);
    let offset = start.iter().zip(&st).map(|(a, s)| a * s).sum();
    let s: Vec<usize> = st.iter().zip(step).map(|(s, k)| s * k).collect();
    strided_copy(src, offset, &s, out, dst, size);
}

/// Stretches size-1 axes of `src` (same rank as `out`) with stride 0.
pub fn broadcast(src: &[u8], shape: &[usize], out: &[usize], dst: &mut [u8], size: usize) {
    let st: Vec<usize> = strides(shape)
        .iter()
        .zip(shape)
        .map(|(&s, &d)| if d == 1 { 0 } else { s })
        .collect();
    strided_copy(src, 0, &st, out, dst, size);
}

/// Joins `parts` along `axis`: each part's rows of `inner` bytes land side by side.
pub fn concat(parts: &[(&[u8], &[usize])], axis: usize, out: &[usize], dst: &mut [u8], size: usize) {
    let outer: usize = out[..axis].iter().product();
    let inner: usize = out[axis + 1..].iter().product::<usize>() * size;
    let row = out[axis] * inner;
    let mut at = 0;
    for (src, shape) in parts {
        let w = shape[axis] * inner;
        for o in 0..outer {
            dst[o * row + at..o * row + at + w].copy_from_slice(&src[o * w..(o + 1) * w]);
        }
        at += w;
    }
}
