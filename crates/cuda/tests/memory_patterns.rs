//! How fast the GPU streams a 4-bit weight matrix in the access patterns a decode GEMV can use,
//! with the arithmetic left out (or replaced by a fixed dependent chain): a probe that separates
//! the cost of the memory pattern from the cost of the kernel around it. Ignored by default;
//! on the GPU machine: `.gpu/tests/memory_patterns-test --ignored --nocapture`.
#![cfg(feature = "cuda")]

use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};

const SOURCE: &str = r#"
typedef long long i64;
__device__ __forceinline__ uint4 ld(const uint4* p) { return __ldcs(p); }
__device__ __forceinline__ unsigned fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

// Contiguous reads, grid-stride, four 16-byte loads in flight a thread: the copy-like baseline.
extern "C" __global__ void stream(const uint4* w, i64 words, unsigned* out) {
  unsigned acc = 0;
  const i64 stride = (i64)gridDim.x * blockDim.x;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < words; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; u++) v[u] = i + u * stride < words ? ld(w + i + u * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < 4; u++) acc ^= fold(v[u]);
  }
  if (acc == 0x9e3779b9u) out[0] = acc;
}

// The 16-byte word a lane reads in slot s (0..3) of chunk c (256 values of k) of a 16-row tile:
// row-major (MLX's layout: lane (g, t) reads words t and t + 4 of rows g and g + 8) or packed
// (each chunk of a tile one contiguous 2 KB block, slot-major, so a warp load is 512 bytes).
__device__ __forceinline__ i64 word_at(int packed, i64 tile, i64 c, int s, int lane, i64 k) {
  if (packed) return ((tile * (k / 256) + c) * 4 + s) * 32 + lane;
  const int g = lane >> 2, t = lane & 3;
  return (tile * 16 + g + 8 * (s & 1)) * (k / 32) + c * 8 + t + 4 * (s >> 1);
}

__device__ __forceinline__ unsigned use(const uint4* q, unsigned acc, int spin) {
  acc ^= fold(q[0]) ^ fold(q[1]) ^ fold(q[2]) ^ fold(q[3]);
  for (int i = 0; i < spin; i++) acc = acc * 1664525u + 1013904223u;
  return acc;
}

// A tensor-core-GEMV-shaped walk: blocks over 16-row tiles, a block's warps splitting each
// tile's chunks, a block barrier a tile. depth 1: a warp loads a chunk, then uses it; depth 2:
// it requests the next chunk of the tile before using the current; depth 3: the same across
// tile boundaries (a warp's chunks of all its block's tiles are one sequence).
extern "C" __global__ void tiles(const uint4* w, i64 n, i64 k, int packed, int depth, int spin, unsigned* out) {
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5, lane = threadIdx.x & 31;
  const i64 chunks = k / 256, tiles = n / 16;
  __shared__ unsigned part[32];
  unsigned acc = 0, total = 0;
  uint4 q[4], p[4];
  i64 tile = blockIdx.x, c = warp;
  auto fetch = [&](uint4* d, i64 tl, i64 ch) {
#pragma unroll
    for (int s = 0; s < 4; s++) d[s] = ld(w + word_at(packed, tl, ch, s, lane, k));
  };
  if (depth == 3) {
    if (tile < tiles && c < chunks) fetch(q, tile, c);
    while (tile < tiles) {
      i64 nt = tile, nc = c + warps;
      if (nc >= chunks) nt += gridDim.x, nc = warp;
      if (nt < tiles && nc < chunks) fetch(p, nt, nc);
      if (c < chunks) acc = use(q, acc, spin);
      if (nt != tile) {
        if (lane == 0) part[warp] = acc;
        __syncthreads();
        if (threadIdx.x == 0)
          for (int i = 0; i < warps; i++) total ^= part[i];
        __syncthreads();
      }
#pragma unroll
      for (int s = 0; s < 4; s++) q[s] = p[s];
      tile = nt, c = nc;
    }
  } else {
    for (; tile < tiles; tile += gridDim.x) {
      if (depth == 1) {
        for (i64 ch = warp; ch < chunks; ch += warps) {
          fetch(q, tile, ch);
          acc = use(q, acc, spin);
        }
      } else {
        if (warp < chunks) fetch(q, tile, warp);
        for (i64 ch = warp; ch < chunks; ch += warps) {
          if (ch + warps < chunks) fetch(p, tile, ch + warps);
          acc = use(q, acc, spin);
#pragma unroll
          for (int s = 0; s < 4; s++) q[s] = p[s];
        }
      }
      if (lane == 0) part[warp] = acc;
      __syncthreads();
      if (threadIdx.x == 0)
        for (int i = 0; i < warps; i++) total ^= part[i];
      __syncthreads();
    }
  }
  if ((acc ^ total) == 0x9e3779b9u) out[0] = acc;
}

// Packed chunks (2 KB each, tile-major) split into one contiguous range a warp, no barriers:
// the streaming limit of the packed layout. depth 1 or 2 chunks in flight a warp.
extern "C" __global__ void ranges(const uint4* w, i64 n, i64 k, int depth, int spin, unsigned* out) {
  const int lane = threadIdx.x & 31;
  const i64 all = (n / 16) * (k / 256), warps = (i64)gridDim.x * (blockDim.x >> 5);
  const i64 me = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const i64 b0 = all * me / warps, b1 = all * (me + 1) / warps;
  unsigned acc = 0;
  uint4 q[4], p[4];
  auto fetch = [&](uint4* d, i64 b) {
#pragma unroll
    for (int s = 0; s < 4; s++) d[s] = ld(w + (b * 4 + s) * 32 + lane);
  };
  if (depth == 1) {
    for (i64 b = b0; b < b1; b++) {
      fetch(q, b);
      acc = use(q, acc, spin);
    }
  } else {
    if (b0 < b1) fetch(q, b0);
    for (i64 b = b0; b < b1; b++) {
      if (b + 1 < b1) fetch(p, b + 1);
      acc = use(q, acc, spin);
#pragma unroll
      for (int s = 0; s < 4; s++) q[s] = p[s];
    }
  }
  if (acc == 0x9e3779b9u) out[0] = acc;
}
"#;

/// `grid` blocks of `warps` warps, no dynamic shared memory.
fn config(grid: i64, warps: i64) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid as u32, 1, 1),
        block_dim: (32 * warps as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

#[test]
#[ignore = "a GPU probe: run by hand on the GPU machine"]
fn weight_streaming_patterns() {
    let ctx = CudaContext::new(0).expect("a GPU");
    let stream = ctx.default_stream();
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some("sm_90"),
        options: vec!["--std=c++17".into()],
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(SOURCE, opts).expect("the probe compiles");
    let module = ctx.load_module(ptx).unwrap();
    let f_stream = module.load_function("stream").unwrap();
    let f_tiles = module.load_function("tiles").unwrap();
    let f_ranges = module.load_function("ranges").unwrap();
    const POOL: usize = 1 << 30;
    let buf = stream.alloc_zeros::<u8>(POOL).unwrap();
    let out = stream.alloc_zeros::<u32>(1).unwrap();
    let sms = 132i64;
    // Times `launch(offset)` over regions of `bytes` taken in turn from the pool (so L2 never
    // holds the next one), in µs a launch.
    let time = |bytes: usize, launch: &dyn Fn(u64)| -> f64 {
        let regions = (POOL / bytes).max(1);
        for r in 0..3 {
            launch((r % regions * bytes) as u64);
        }
        let runs = 30;
        let start = stream
            .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .unwrap();
        for r in 0..runs {
            launch(((r + 3) % regions * bytes) as u64);
        }
        let end = stream
            .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .unwrap();
        end.synchronize().unwrap();
        start.elapsed_ms(&end).unwrap() as f64 * 1e3 / runs as f64
    };
    use cudarc::driver::DevicePtr;
    let (base, _guard) = buf.device_ptr(&stream);
    println!("| n x k | pattern | depth | spin | warps | grid | µs | TB/s |");
    println!("|---|---|---|---|---|---|---|---|");
    for (n, k) in [
        (4096i64, 4096i64),
        (6144, 4096),
        (28672, 4096),
        (4096, 14336),
        (128256, 4096),
    ] {
        let bytes = (n * k / 2) as usize;
        let words = bytes as i64 / 16;
        let us = time(bytes, &|off| {
            let p = base + off;
            let mut b = stream.launch_builder(&f_stream);
            b.arg(&p).arg(&words).arg(&out);
            unsafe { b.launch(config(4 * sms, 16)) }.unwrap();
        });
        println!(
            "| {n} x {k} | stream | 4 | 0 | 16 | {} | {us:.1} | {:.2} |",
            4 * sms,
            bytes as f64 / us / 1e6
        );
        let tiles = n / 16;
        let chunks = k / 256;
        let auto_warps = {
            let want = ((sms * 32) as f64 / tiles as f64)
                .ceil()
                .clamp(2.0, 16.0)
                .min(chunks as f64) as i64;
            (0..=4).rev().map(|p| 1i64 << p).find(|&w| w <= want).unwrap_or(1)
        };
        for (packed, depth, spin, warps, persistent) in [
            (0, 1, 0, auto_warps, false),
            (1, 1, 0, auto_warps, false),
            (0, 1, 128, auto_warps, false),
            (1, 1, 128, auto_warps, false),
            (0, 2, 128, auto_warps, false),
            (1, 2, 128, auto_warps, false),
            (0, 3, 128, 8, true),
            (1, 3, 128, 8, true),
            (1, 3, 128, 4, true),
            (1, 3, 128, 16, true),
            (1, 3, 0, 8, true),
        ] {
            let grid = if persistent {
                tiles.min(sms * (64 / warps))
            } else {
                tiles
            };
            let us = time(bytes, &|off| {
                let p = base + off;
                let mut b = stream.launch_builder(&f_tiles);
                b.arg(&p).arg(&n).arg(&k).arg(&packed).arg(&depth).arg(&spin).arg(&out);
                unsafe { b.launch(config(grid, warps)) }.unwrap();
            });
            println!(
                "| {n} x {k} | {} | {depth} | {spin} | {warps} | {grid} | {us:.1} | {:.2} |",
                if packed == 1 { "packed" } else { "row-major" },
                bytes as f64 / us / 1e6
            );
        }
        for (depth, spin, warps, per_sm) in [
            (1, 128, 8, 8),
            (2, 128, 8, 8),
            (2, 128, 4, 16),
            (2, 0, 8, 8),
            (2, 128, 16, 4),
        ] {
            let grid = sms * per_sm;
            let us = time(bytes, &|off| {
                let p = base + off;
                let mut b = stream.launch_builder(&f_ranges);
                b.arg(&p).arg(&n).arg(&k).arg(&depth).arg(&spin).arg(&out);
                unsafe { b.launch(config(grid, warps)) }.unwrap();
            });
            println!(
                "| {n} x {k} | packed ranges | {depth} | {spin} | {warps} | {grid} | {us:.1} | {:.2} |",
                bytes as f64 / us / 1e6
            );
        }
    }
}
