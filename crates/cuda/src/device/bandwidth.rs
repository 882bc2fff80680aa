//! Device memory figures for `mlxcel bench`: device-to-device copy bandwidth timed with CUDA
//! events, and the memory in use as the driver reports it.

use cudarc::driver::sys::CUevent_flags;
use mlxcel_core::Result;

use super::{driver_err, Gpu};

/// Bytes per buffer: far past the H200's 60 MB L2, so the copy runs from HBM.
pub const COPY_BYTES: usize = 1 << 30;
const REPEATS: usize = 10;

impl Gpu {
    /// `REPEATS` back-to-back copies of `bytes` between two device buffers after one warm-up
    /// copy, in bytes (read + written) per second.
    pub fn copy_bandwidth(&self, bytes: usize) -> Result<f64> {
        let src = self.alloc(bytes)?;
        let mut dst = self.alloc(bytes)?;
        self.stream.memcpy_dtod(&src, &mut dst).map_err(driver_err)?;
        let timing = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.stream.record_event(timing).map_err(driver_err)?;
        for _ in 0..REPEATS {
            self.stream.memcpy_dtod(&src, &mut dst).map_err(driver_err)?;
        }
        let end = self.stream.record_event(timing).map_err(driver_err)?;
        let ms = start.elapsed_ms(&end).map_err(driver_err)? as f64;
        Ok(2.0 * (bytes * REPEATS) as f64 / (ms / 1e3).max(1e-9))
    }

    /// `total - free` from cuMemGetInfo: every allocation on the device, this context's included.
    pub fn memory_used(&self) -> Result<usize> {
        let (free, total) = self.stream.context().mem_get_info().map_err(driver_err)?;
        Ok(total.saturating_sub(free))
    }
}
