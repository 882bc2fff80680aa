//! MLX affine quantization on the host: the packed layout kernels read, and a reference
//! quantizer for tests and conversion. Element `j` of a row lives in word `j / (32/bits)` at
//! bit `(j mod (32/bits)) · bits`; group `g` of a row dequantizes as `q · scale[g] + bias[g]`.

/// Quantized element `j` of a packed row.
pub fn unpack(row: &[u32], j: usize, bits: u32) -> u32 {
    let per_word = 32 / bits as usize;
    (row[j / per_word] >> ((j % per_word) as u32 * bits)) & ((1u32 << bits) - 1)
}

/// A row-major `[rows, cols]` matrix quantized MLX-style.
#[derive(Clone, Debug)]
pub struct Quantized {
    pub packed: Vec<u32>,
    pub scales: Vec<f32>,
    pub biases: Vec<f32>,
    pub rows: usize,
    pub cols: usize,
    pub bits: u32,
    pub group_size: usize,
}

/// Min/max affine quantization of each group of `group_size` along a row. `cols` must be a
/// multiple of `group_size` and of `32 / bits`.
pub fn quantize(w: &[f32], rows: usize, cols: usize, bits: u32, group_size: usize) -> Quantized {
    assert_eq!(w.len(), rows * cols);
    assert!(cols.is_multiple_of(group_size) && cols.is_multiple_of(32 / bits as usize));
    let levels = ((1u32 << bits) - 1) as f32;
    let groups = cols / group_size;
    let per_word = 32 / bits as usize;
    let mut q = Quantized {
        packed: vec![0; rows * cols / per_word],
        scales: Vec::with_capacity(rows * groups),
        biases: Vec::with_capacity(rows * groups),
        rows,
        cols,
        bits,
        group_size,
    };
    for r in 0..rows {
        for g in 0..groups {
            let vals = &w[r * cols + g * group_size..r * cols + (g + 1) * group_size];
            let lo = vals.iter().copied().fold(f32::INFINITY, f32::min);
            let hi = vals.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let scale = if hi > lo { (hi - lo) / levels } else { 1.0 };
            q.scales.push(scale);
            q.biases.push(lo);
            for (i, &v) in vals.iter().enumerate() {
                let level = ((v - lo) / scale).round().clamp(0.0, levels) as u32;
                let j = g * group_size + i;
                q.packed[(r * cols + j) / per_word] |= level << ((j % per_word) as u32 * bits);
            }
        }
    }
    q
}

impl Quantized {
    /// The matrix the quantized form stands for, `[rows, cols]`.
    pub fn dequantize(&self) -> Vec<f32> {
        let words = self.cols * self.bits as usize / 32;
        let groups = self.cols / self.group_size;
        let mut out = Vec::with_capacity(self.rows * self.cols);
        for r in 0..self.rows {
            let row = &self.packed[r * words..(r + 1) * words];
            for j in 0..self.cols {
                let g = r * groups + j / self.group_size;
                out.push(unpack(row, j, self.bits) as f32 * self.scales[g] + self.biases[g]);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpack_reads_low_bits_first() {
        // 4-bit: elements 0..8 are nibbles from least significant.
        let row = [0x7654_3210u32];
        for j in 0..8 {
            assert_eq!(unpack(&row, j, 4), j as u32);
        }
        assert_eq!(unpack(&[0xa1b2_c3d4], 1, 8), 0xc3);
    }

    #[test]
    fn quantize_then_dequantize_is_within_half_a_step() {
        let mut rng = crate::rng::SplitMix64(5);
        for bits in [2, 4, 8] {
            let w = rng.signed_vec(3 * 64, 1.0);
            let q = quantize(&w, 3, 64, bits, 32);
            for (i, (a, b)) in w.iter().zip(q.dequantize()).enumerate() {
                let step = q.scales[i / 32];
                assert!((a - b).abs() <= 0.5 * step + 1e-6, "{bits}-bit element {i}: {a} vs {b}");
            }
        }
    }
}
