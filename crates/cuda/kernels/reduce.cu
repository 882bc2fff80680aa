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

#define REDUCE_KERNELS(S, D)                                                                                  \
  extern "C" __global__ void reduce_##S(int op, const D::T* x, D::T* y, unsigned* yi, i64 n, i64 inner) {      \
    reduce<D>(op, x, y, yi, n, inner);                                                                        \
  }                                                                                                           \
  extern "C" __global__ void softmax_##S(const D::T* x, D::T* y, i64 n, i64 inner) { softmax<D>(x, y, n, inner); } \
  extern "C" __global__ void cumsum_##S(const D::T* x, D::T* y, i64 outer, i64 n, i64 inner, int reverse) {     \
    cumsum<D>(x, y, outer, n, inner, reverse);                                                                \
  }
REDUCE_KERNELS(f32, F32)
REDUCE_KERNELS(f16, F16)
REDUCE_KERNELS(bf16, BF16)
