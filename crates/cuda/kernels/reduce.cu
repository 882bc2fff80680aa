// Reductions, softmax and prefix sums over the middle axis of [outer, n, inner]; one block per
// (outer, inner) output, f32 accumulation.

template <typename D>
__device__ void reduce(int op, const typename D::T* x, typename D::T* y, unsigned* yi, i64 n, i64 inner) {
  i64 o = blockIdx.x / inner, i = blockIdx.x % inner;
  const i64 base = o * n * inner + i;
  if (op == 3) {  // argmax: first index of the maximum
    float best = -INFINITY; i64 at = n;
    for (i64 k = threadIdx.x; k < n; k += blockDim.x) {
      float v = D::ld(x, base + k * inner);
      if (v > best) { best = v; at = k; }
    }
    __shared__ float bv[1024]; __shared__ i64 bi[1024];
    bv[threadIdx.x] = best; bi[threadIdx.x] = at;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s) {
        float v2 = bv[threadIdx.x + s]; i64 k2 = bi[threadIdx.x + s];
        if (v2 > bv[threadIdx.x] || (v2 == bv[threadIdx.x] && k2 < bi[threadIdx.x])) { bv[threadIdx.x] = v2; bi[threadIdx.x] = k2; }
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) yi[blockIdx.x] = (unsigned)(bi[0] == n ? 0 : bi[0]);
    return;
  }
  float acc = op == 0 ? 0.0f : op == 1 ? -INFINITY : op == 2 ? INFINITY : -INFINITY;
  if (op == 4) {  // logsumexp
    float m = -INFINITY;
    for (i64 k = threadIdx.x; k < n; k += blockDim.x) m = fmaxf(m, D::ld(x, base + k * inner));
    m = block_max(m);
    float s = 0.0f;
    if (m != -INFINITY) for (i64 k = threadIdx.x; k < n; k += blockDim.x) s += expf(D::ld(x, base + k * inner) - m);
    s = block_sum(s);
    if (threadIdx.x == 0) D::st(y, blockIdx.x, m == -INFINITY ? m : m + logf(s));
    return;
  }
  for (i64 k = threadIdx.x; k < n; k += blockDim.x) {
    float v = D::ld(x, base + k * inner);
    acc = op == 0 ? acc + v : op == 1 ? fmaxf(acc, v) : fminf(acc, v);
  }
  if (op == 0) acc = block_sum(acc);
  else if (op == 1) acc = block_max(acc);
  else acc = -block_max(-acc);
  if (threadIdx.x == 0) D::st(y, blockIdx.x, acc);
}

template <typename D>
__device__ void softmax(const typename D::T* x, typename D::T* y, i64 n, i64 inner) {
  i64 o = blockIdx.x / inner, i = blockIdx.x % inner;
  const i64 base = o * n * inner + i;
  float m = -INFINITY;
  for (i64 k = threadIdx.x; k < n; k += blockDim.x) m = fmaxf(m, D::ld(x, base + k * inner));
  m = block_max(m);
  float s = 0.0f;
  if (m != -INFINITY) for (i64 k = threadIdx.x; k < n; k += blockDim.x) s += expf(D::ld(x, base + k * inner) - m);
  s = block_sum(s);
  float inv = (m == -INFINITY) ? 0.0f : 1.0f / s;
  for (i64 k = threadIdx.x; k < n; k += blockDim.x) {
    float v = (m == -INFINITY) ? 0.0f : expf(D::ld(x, base + k * inner) - m) * inv;
    D::st(y, base + k * inner, v);
  }
}

template <typename D>
__device__ void cumsum(const typename D::T* x, typename D::T* y, i64 outer, i64 n, i64 inner, int reverse) {
  for (i64 r = gid(); r < outer * inner; r += gstride()) {
    i64 o = r / inner, i = r % inner;
    float acc = 0.0f;
    for (i64 s = 0; s < n; s++) {
      i64 k = reverse ? n - 1 - s : s;
      i64 at = (o * n + k) * inner + i;
      acc += D::ld(x, at);
      D::st(y, at, acc);
    }
  }
}

// The first maximum of (v, i) pairs: the larger value, then the smaller index.
__device__ __forceinline__ void argmax_pick(float& v, unsigned& i, float v2, unsigned i2) {
  if (v2 > v || (v2 == v && i2 < i)) { v = v2; i = i2; }
}
__device__ __forceinline__ void argmax_warp(float& v, unsigned& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
    const unsigned i2 = __shfl_xor_sync(0xffffffffu, i, o);
    argmax_pick(v, i, v2, i2);
  }
}

// Argmax of long rows [rows, n] (the LM head's logits) over many blocks: block (row, part)
// takes one slice of the row and writes its first maximum to pv/pi [rows, parts] (index n
// where the slice has no value above -inf); argmax_final merges them per row, as reduce's
// argmax would (first index of the maximum; 0 where no value is above -inf).
template <typename D>
__device__ void argmax_part(const typename D::T* x, float* pv, unsigned* pi, i64 n) {
  const i64 row = blockIdx.x, part = blockIdx.y, parts = gridDim.y;
  const i64 per = (n + parts - 1) / parts, lo = part * per, hi = lo + per < n ? lo + per : n;
  float best = -INFINITY;
  unsigned at = (unsigned)n;
  for (i64 k = lo + threadIdx.x; k < hi; k += blockDim.x) argmax_pick(best, at, D::ld(x, row * n + k), (unsigned)k);
  argmax_warp(best, at);
  __shared__ float wv[32];
  __shared__ unsigned wi[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) { wv[warp] = best; wi[warp] = at; }
  __syncthreads();
  if (warp == 0) {
    best = lane < (int)(blockDim.x >> 5) ? wv[lane] : -INFINITY;
    at = lane < (int)(blockDim.x >> 5) ? wi[lane] : (unsigned)n;
    argmax_warp(best, at);
    if (lane == 0) { pv[row * parts + part] = best; pi[row * parts + part] = at; }
  }
}

// One warp a row over the parts' partials.
extern "C" __global__ void argmax_final(const float* pv, const unsigned* pi, i64 parts, i64 n, unsigned* yi) {
  const i64 row = blockIdx.x;
  float best = -INFINITY;
  unsigned at = (unsigned)n;
  for (i64 p = threadIdx.x; p < parts; p += 32) argmax_pick(best, at, pv[row * parts + p], pi[row * parts + p]);
  argmax_warp(best, at);
  if (threadIdx.x == 0) yi[row] = at == (unsigned)n ? 0u : at;
}

#define REDUCE_KERNELS(S, D)                                                                                  \
  extern "C" __global__ void reduce_##S(int op, const D::T* x, D::T* y, unsigned* yi, i64 n, i64 inner) {      \
    reduce<D>(op, x, y, yi, n, inner);                                                                        \
  }                                                                                                           \
  extern "C" __global__ void argmax_part_##S(const D::T* x, float* pv, unsigned* pi, i64 n) {                     \
    argmax_part<D>(x, pv, pi, n);                                                                             \
  }                                                                                                           \
  extern "C" __global__ void softmax_##S(const D::T* x, D::T* y, i64 n, i64 inner) { softmax<D>(x, y, n, inner); } \
  extern "C" __global__ void cumsum_##S(const D::T* x, D::T* y, i64 outer, i64 n, i64 inner, int reverse) {     \
    cumsum<D>(x, y, outer, n, inner, reverse);                                                                \
  }
REDUCE_KERNELS(f32, F32)
REDUCE_KERNELS(f16, F16)
REDUCE_KERNELS(bf16, BF16)

// MoE's combine of the routed experts: out [rows, d] = sum over j < k of y [rows, k, d] · w
// [rows, k], as mul (rounded to dt) then a sum over the middle axis. A warp an output: lane j
// takes expert j (k <= 32), and the lanes add in the order the plain 256-thread reduction does
// (warp 0's butterfly, lane 0's value), so the result equals the unfused graph's.
__device__ __forceinline__ void weighted_sum_warp(const void* y, const void* w, int dt, i64 rows, i64 k, i64 d,
                                                  void* out) {
  const i64 o = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (o >= rows * d) return;
  const i64 r = o / d, c = o % d;
  const float v = lane < k ? round_to(ldf(y, dt, (r * k + lane) * d + c) * ldf(w, dt, r * k + lane), dt) : 0.0f;
  const float s = warp_sum(v);
  if (lane == 0) stf(out, dt, o, s);
}
extern "C" __global__ void weighted_sum(const void* y, const void* w, int dt, i64 rows, i64 k, i64 d, void* out) {
  weighted_sum_warp(y, w, dt, rows, k, d, out);
}
// The same, letting the next launch start at once (launch.rs, MLXCEL_PDL_COMBINE=1): in a
// decode step the next layer's q, k and v products, launched programmatically, then request
// their first weights while the combine runs.
extern "C" __global__ void weighted_sum_pdl(const void* y, const void* w, int dt, i64 rows, i64 k, i64 d,
                                            void* out) {
  pdl_trigger();
  weighted_sum_warp(y, w, dt, rows, k, d, out);
}

// The same for many rows (prefill): a thread an output, adding as warp_sum's butterfly leaves
// lane 0's value (a[i] += a[i + s] for s = 16, 8, 4, 2, 1, zeros past k), so the result equals
// weighted_sum's and the unfused graph's.
extern "C" __global__ void weighted_sum_rows(const void* y, const void* w, int dt, i64 rows, i64 k, i64 d,
                                             void* out) {
  for (i64 o = gid(); o < rows * d; o += gstride()) {
    const i64 r = o / d, c = o % d;
    float a[32];
#pragma unroll
    for (int j = 0; j < 32; j++) a[j] = j < k ? round_to(ldf(y, dt, (r * k + j) * d + c) * ldf(w, dt, r * k + j), dt) : 0.0f;
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) {
#pragma unroll
      for (int i = 0; i < s; i++) a[i] += a[i + s];
    }
    stf(out, dt, o, a[0]);
  }
}

// The same for f16/bf16 with k <= 8 and d a multiple of 8 (qwen3-moe's top 8 at prefill): a
// thread 8 adjacent outputs, each expert's 8 values one 16-byte load, added in the butterfly's
// order over 8 (its steps past 8 add zeros), so the result equals weighted_sum_rows's. The
// thread an output of weighted_sum_rows, 32 predicated slots each, took 73 us for 512 x 8 x 2048
// on the H100.
extern "C" __global__ void weighted_sum_rows8(const void* y, const void* w, int dt, i64 rows, i64 k, i64 d,
                                              void* out) {
  const i64 per = d / 8;
  for (i64 o = gid(); o < rows * per; o += gstride()) {
    const i64 r = o / per, c = (o - r * per) * 8;
    float a[8][8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
      uint4 v = make_uint4(0, 0, 0, 0);
      float wj = 0.0f;
      if (j < k) {
        v = *(const uint4*)((const unsigned short*)y + (r * k + j) * d + c);
        wj = ldf(w, dt, r * k + j);
      }
      const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 8; e++) {
        const float x = bits_float((u[e / 2] >> (16 * (e & 1))) & 0xffffu, dt);
        a[j][e] = j < k ? round_to(x * wj, dt) : 0.0f;
      }
    }
#pragma unroll
    for (int step = 4; step > 0; step >>= 1)
#pragma unroll
      for (int i = 0; i < step; i++)
#pragma unroll
        for (int e = 0; e < 8; e++) a[i][e] += a[i + step][e];
    union { uint4 v; unsigned short h[8]; } res;
#pragma unroll
    for (int e = 0; e < 8; e++) {
      if (dt == 1) F16::st(res.h, e, a[0][e]);
      else BF16::st(res.h, e, a[0][e]);
    }
    *(uint4*)((unsigned short*)out + r * d + c) = res.v;
  }
}

