//! Host memory copy bandwidth: the ceiling for a decode step that streams its weights from RAM.

use std::time::Instant;

use rayon::prelude::*;

/// Bytes per buffer: several times any last-level cache, so the copy runs from DRAM.
pub const COPY_BYTES: usize = 256 << 20;
const REPEATS: usize = 5;

/// Best of [`REPEATS`] copies of `bytes` bytes between two buffers, split over the rayon pool
/// the kernels use, in bytes (read + written) per second.
pub fn copy_bandwidth(bytes: usize) -> f64 {
    let src = vec![1u8; bytes];
    // Written once first, so page faults stay out of the timed copies.
    let mut dst = vec![0u8; bytes];
    let chunk = bytes.div_ceil(rayon::current_num_threads().max(1)).max(4096);
    let mut best = f64::INFINITY;
    for _ in 0..=REPEATS {
        let start = Instant::now();
        dst.par_chunks_mut(chunk)
            .zip(src.par_chunks(chunk))
            .for_each(|(d, s)| d.copy_from_slice(s));
        best = best.min(start.elapsed().as_secs_f64());
    }
    std::hint::black_box(&dst);
    2.0 * bytes as f64 / best.max(1e-9)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_copy_takes_measurable_time() {
        let bw = super::copy_bandwidth(8 << 20);
        // From a slow emulator to the fastest HBM: anything outside this range is a timing bug.
        assert!(bw.is_finite() && bw > 1e8 && bw < 1e13, "{bw}");
    }
}
