//! Counter-based random numbers: a pure function of `(seed, counter, row, column)`, so the CPU
//! and CUDA backends draw the same noise and a run replays exactly from its seed.

/// SplitMix64's finalizer: a bijective mix of 64 bits.
pub fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Uniform in the open interval (0, 1), 24 bits of resolution.
pub fn uniform(seed: u64, counter: u32, row: u32, col: u32) -> f32 {
    let x = mix64(mix64(seed ^ counter as u64) ^ ((row as u64) << 32 | col as u64));
    ((x >> 40) as f32 + 0.5) * (1.0 / 16_777_216.0)
}

/// Standard Gumbel noise, `-ln(-ln u)`.
pub fn gumbel(seed: u64, counter: u32, row: u32, col: u32) -> f32 {
    -(-uniform(seed, counter, row, col).ln()).ln()
}

/// A small seeded generator for test data and random weights.
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.0)
    }

    /// Uniform in [-1, 1).
    pub fn next_signed(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / 8_388_608.0 - 1.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn signed_vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next_signed() * scale).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_stays_inside_the_open_interval_and_is_roughly_flat() {
        let mut buckets = [0u32; 10];
        for col in 0..100_000 {
            let u = uniform(7, 3, 1, col);
            assert!(u > 0.0 && u < 1.0);
            buckets[(u * 10.0) as usize] += 1;
        }
        for b in buckets {
            assert!((9_000..11_000).contains(&b), "bucket count {b}");
        }
    }

    #[test]
    fn draws_depend_on_every_key_part() {
        let base = uniform(1, 2, 3, 4);
        assert_ne!(base, uniform(9, 2, 3, 4));
        assert_ne!(base, uniform(1, 9, 3, 4));
        assert_ne!(base, uniform(1, 2, 9, 4));
        assert_ne!(base, uniform(1, 2, 3, 9));
        assert_eq!(base, uniform(1, 2, 3, 4));
    }
}
