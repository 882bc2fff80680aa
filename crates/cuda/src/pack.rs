//! The tile-packed layout of 4-bit weights that the tensor-core GEMV reads with `Q4_PACKED`
//! (gemv.cu): each tile of 16 rows stored as its chunks of 256 values one after another, a
//! chunk as four 512-byte slots in the order the kernel's lanes load them, so every warp load is
//! 512 contiguous bytes (MLX's row-major layout makes each one 16 pieces of 32 bytes, a weight
//! row apart). Scales and biases are reordered the same way. Pure permutations, done once at
//! load; no GPU needed, so the layout is tested here.

/// Whether a 4-bit weight of `n` rows and `k` values a row can take the packed layout.
pub fn packable(n: usize, k: usize, group: usize) -> bool {
    n > 0 && n.is_multiple_of(16) && k > 0 && k.is_multiple_of(256) && matches!(group, 32 | 64 | 128)
}

/// The packed order of a 4-bit weight's words `w` ([n, k / 8] u32, MLX's row-major packing):
/// 16-byte word `j` of row `r` (of k / 32) goes to tile r / 16, chunk j / 8, slot s, lane l,
/// where lane (g, t) = (l / 4, l % 4) of the tensor-core GEMV reads rows g and g + 8 of the tile
/// and words t and t + 4 of the chunk: slot 0 row g word t, 1 row g + 8 word t, 2 row g word
/// t + 4, 3 row g + 8 word t + 4.
pub fn pack_q4_words(w: &[u32], n: usize, k: usize) -> Vec<u32> {
    assert!(packable(n, k, 64) && w.len() == n * k / 8, "pack_q4_words: {n} x {k}");
    let row_words = k / 32; // 16-byte words a row
    let chunks = k / 256;
    let mut out = vec![0u32; w.len()];
    for tile in 0..n / 16 {
        for c in 0..chunks {
            for slot in 0..4 {
                for lane in 0..32 {
                    let (g, t) = (lane / 4, lane % 4);
                    let row = tile * 16 + g + 8 * (slot & 1);
                    let word = c * 8 + t + 4 * (slot >> 1);
                    let src = (row * row_words + word) * 4;
                    let dst = (((tile * chunks + c) * 4 + slot) * 32 + lane) * 4;
                    out[dst..dst + 4].copy_from_slice(&w[src..src + 4]);
                }
            }
        }
    }
    out
}

/// The packed order of a weight's scales or biases `s` ([n, k / group] 16-bit values): each
/// chunk's 16 rows of 256 / group values, row by row, chunks of a tile in order.
pub fn pack_q4_groups(s: &[u16], n: usize, k: usize, group: usize) -> Vec<u16> {
    assert!(
        packable(n, k, group) && s.len() == n * k / group,
        "pack_q4_groups: {n} x {k} / {group}"
    );
    let (per, groups, chunks) = (256 / group, k / group, k / 256);
    let mut out = vec![0u16; s.len()];
    for row in 0..n {
        for gi in 0..groups {
            let (c, i) = (gi / per, gi % per);
            out[(((row / 16) * chunks + c) * 16 + row % 16) * per + i] = s[row * groups + gi];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Word (row, 16-byte word, u32 within it) tagged as a distinct u32.
    fn tagged(n: usize, k: usize) -> Vec<u32> {
        (0..n * k / 8).map(|i| (i as u32).wrapping_mul(2654435761)).collect()
    }

    #[test]
    fn a_lane_finds_its_rows_and_words_where_the_kernel_reads_them() {
        let (n, k) = (48, 768);
        let w = tagged(n, k);
        let p = pack_q4_words(&w, n, k);
        let row_words = k / 32;
        // The kernel (gemv.cu, tc_qdot's fetch): chunk c of tile T at uint4 (T·chunks + c)·128,
        // lane l at + l, then + 32, + 64, + 96 for rows a/b and words t/t + 4.
        for tile in 0..n / 16 {
            for c in 0..k / 256 {
                for lane in 0..32 {
                    let (g, t) = (lane / 4, lane % 4);
                    let base = ((tile * (k / 256) + c) * 128 + lane) * 4;
                    let want = |row: usize, word: usize| &w[(row * row_words + word) * 4..][..4];
                    let r0 = tile * 16;
                    assert_eq!(&p[base..base + 4], want(r0 + g, c * 8 + t));
                    assert_eq!(&p[base + 128..base + 132], want(r0 + g + 8, c * 8 + t));
                    assert_eq!(&p[base + 256..base + 260], want(r0 + g, c * 8 + t + 4));
                    assert_eq!(&p[base + 384..base + 388], want(r0 + g + 8, c * 8 + t + 4));
                }
            }
        }
    }

    #[test]
    fn words_and_groups_are_permutations() {
        for (n, k, group) in [(16, 256, 32), (32, 512, 64), (64, 1024, 128), (16, 4096, 64)] {
            let w = tagged(n, k);
            let mut a = pack_q4_words(&w, n, k);
            let mut b = w.clone();
            a.sort_unstable();
            b.sort_unstable();
            assert_eq!(a, b, "{n} x {k}");
            let s: Vec<u16> = (0..n * k / group).map(|i| i as u16).collect();
            let mut ps = pack_q4_groups(&s, n, k, group);
            ps.sort_unstable();
            assert_eq!(ps, s, "{n} x {k} / {group}");
        }
    }

    #[test]
    fn a_lane_finds_its_scales_where_the_kernel_reads_them() {
        for group in [32, 64, 128] {
            let (n, k) = (32, 512);
            let groups = k / group;
            let s: Vec<u16> = (0..n * groups).map(|i| i as u16).collect();
            let p = pack_q4_groups(&s, n, k, group);
            // The kernel (tc_qdot's scale_at): runs 2t and 2t + 1 of chunk c (32 values a run)
            // of rows g and g + 8 at ((T·chunks + c)·16 + row in tile)·per + run·32 / group − c·per.
            let per = 256 / group;
            for tile in 0..n / 16 {
                for c in 0..k / 256 {
                    for lane in 0..32 {
                        let (g, t) = (lane / 4, lane % 4);
                        for run in [2 * t, 2 * t + 1] {
                            let gi = run * 32 / group;
                            for row in [g, g + 8] {
                                let at = (((tile * (k / 256) + c) * 16) + row) * per + gi;
                                let r = tile * 16 + row;
                                assert_eq!(p[at], s[r * groups + c * per + gi], "group {group}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn only_whole_tiles_and_chunks_pack() {
        assert!(packable(4096, 4096, 64));
        assert!(!packable(4100, 4096, 64));
        assert!(!packable(4096, 1152, 64)); // Gemma's 1152: a half chunk
        assert!(!packable(4096, 4096, 16));
    }
}
