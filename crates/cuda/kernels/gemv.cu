// Matrix-vector products for decode (at most 8 rows of x): one warp per output column of the
// weight, lanes reading consecutive 16-byte words of the weight row so a warp streams 512
// contiguous bytes per load, four loads in flight per lane. f32 accumulation. The activation
// type is a template parameter (it is read per element); scales, biases and the output use
// runtime dtype codes (read once per 16-32 weights and once per output).

#define GEMV_ROWS 8

// Eight consecutive activations as floats (p 16-byte aligned for 16-bit types, 32 for f32).
template <class X> __device__ __forceinline__ void ldx8(const typename X::T* p, float* o);
template <> __device__ __forceinline__ void ldx8<F32>(const float* p, float* o) {
  float4 a = ((const float4*)p)[0], b = ((const float4*)p)[1];
  o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w; o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
}
__device__ __forceinline__ float h2f(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
template <class W> __device__ __forceinline__ void unpack8(uint4 u, float* o);
template <> __device__ __forceinline__ void unpack8<F16>(uint4 u, float* o) {
  const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; i++) { o[2 * i] = h2f(w[i] & 0xffff); o[2 * i + 1] = h2f(w[i] >> 16); }
}
template <> __device__ __forceinline__ void unpack8<BF16>(uint4 u, float* o) {
  const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; i++) { o[2 * i] = __uint_as_float(w[i] << 16); o[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u); }
}
template <> __device__ __forceinline__ void ldx8<F16>(const unsigned short* p, float* o) { unpack8<F16>(*(const uint4*)p, o); }
template <> __device__ __forceinline__ void ldx8<BF16>(const unsigned short* p, float* o) { unpack8<BF16>(*(const uint4*)p, o); }


// The 32 / BITS unsigned values packed in w (element e at bits e·BITS), as exact floats without
// an int-to-float conversion (a quarter-rate instruction): each byte is placed under the
// exponent of 2²³, where the float's unit in the last place is 1, and 2²³ is subtracted.
template <int BITS> __device__ __forceinline__ void qvals(unsigned w, float* o);
template <> __device__ __forceinline__ void qvals<8>(unsigned w, float* o) {
#pragma unroll
  for (int j = 0; j < 4; j++) o[j] = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440 + j)) - 8388608.0f;
}
template <> __device__ __forceinline__ void qvals<4>(unsigned w, float* o) {
  const unsigned lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    o[2 * j] = __uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7440 + j)) - 8388608.0f;
    o[2 * j + 1] = __uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7440 + j)) - 8388608.0f;
  }
}

// out [n, k] (dtype odt) = dequant(w [n, k·BITS/32]) for BITS 4 or 8: the weight of a large
// prefill product, expanded for cuBLAS. The matrix is walked as one flat run of packed words
// (a word's values share a group, and value j of the flat run is in group j / group, since the
// groups tile each row): a warp takes 32·U consecutive words, lane l words l, l + 32, ..., so
// each of its loads and stores is contiguous across the warp. All of a lane's loads (words,
// scales, biases) are issued before any is used, and each word's values leave in one vector
// store. group is a power of two (32, 64 or 128); scales, biases and the output are typed once
// a launch.
template <class O, int PER> struct Run;
template <class O> struct Run<O, 8> {  // 8 values: one 16-byte store (two for f32)
  static __device__ __forceinline__ void st(void* out, i64 i, const float* v) {
    if constexpr (sizeof(typename O::T) == 4) {
      float4* o = (float4*)((float*)out + i);
      o[0] = make_float4(v[0], v[1], v[2], v[3]);
      o[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      typename O::T h[8];
#pragma unroll
      for (int e = 0; e < 8; e++) O::st(h, e, v[e]);
      *(uint4*)((typename O::T*)out + i) = make_uint4(h[0] | (unsigned)h[1] << 16, h[2] | (unsigned)h[3] << 16,
                                                      h[4] | (unsigned)h[5] << 16, h[6] | (unsigned)h[7] << 16);
    }
  }
};
template <class O> struct Run<O, 4> {  // 4 values: one 8-byte store (16 for f32)
  static __device__ __forceinline__ void st(void* out, i64 i, const float* v) {
    if constexpr (sizeof(typename O::T) == 4) {
      *(float4*)((float*)out + i) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
      typename O::T h[4];
#pragma unroll
      for (int e = 0; e < 4; e++) O::st(h, e, v[e]);
      *(uint2*)((typename O::T*)out + i) = make_uint2(h[0] | (unsigned)h[1] << 16, h[2] | (unsigned)h[3] << 16);
    }
  }
};
template <int BITS, class S, class O>
__device__ __forceinline__ void dequant_flat(const unsigned* __restrict__ w, const void* s_, const void* z_,
                                             void* __restrict__ out, i64 words, int gshift) {
  constexpr int PER = 32 / BITS, U = 4;
  typedef typename S::T ST;
  const ST* s = (const ST*)s_;
  const ST* z = (const ST*)z_;
  const int lane = threadIdx.x & 31;
  const i64 span = 32 * U, warps = (i64)gridDim.x * (blockDim.x >> 5);
  for (i64 base = ((i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * span; base < words;
       base += warps * span) {
    unsigned q[U];
    float sc[U], bi[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const i64 i = base + lane + 32 * u;
      const bool in = i < words;
      const i64 g = in ? (i * PER) >> gshift : 0;
      q[u] = in ? __ldcs(w + i) : 0u;
      sc[u] = S::ld(s, g);
      bi[u] = S::ld(z, g);
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      const i64 i = base + lane + 32 * u;
      if (i >= words) break;
      float v[PER];
      qvals<BITS>(q[u], v);
#pragma unroll
      for (int e = 0; e < PER; e++) v[e] = v[e] * sc[u] + bi[u];
      Run<O, PER>::st(out, i * PER, v);
    }
  }
}
// Grid: any; blocks of any multiple of 32 threads (each warp takes 128 words a turn).
#define DEQUANT_WORDS(BITS)                                                                                           \
  extern "C" __global__ void dequant_words_##BITS(const unsigned* w, const void* s, const void* z, int sdt,          \
                                                  void* out, int odt, i64 n, i64 k, int group) {                      \
    const i64 words = n * (k / (32 / BITS));                                                                          \
    const int gshift = __ffs(group) - 1;                                                                              \
    if (sdt == 0) DEQUANT_OUT(BITS, F32)                                                                              \
    else if (sdt == 1) DEQUANT_OUT(BITS, F16)                                                                         \
    else DEQUANT_OUT(BITS, BF16)                                                                                      \
  }
#define DEQUANT_OUT(BITS, S)                                                                                          \
  {                                                                                                                   \
    if (odt == 0) dequant_flat<BITS, S, F32>(w, s, z, out, words, gshift);                                            \
    else if (odt == 1) dequant_flat<BITS, S, F16>(w, s, z, out, words, gshift);                                       \
    else dequant_flat<BITS, S, BF16>(w, s, z, out, words, gshift);                                                    \
  }
DEQUANT_WORDS(4)
DEQUANT_WORDS(8)
#undef DEQUANT_WORDS
#undef DEQUANT_OUT

// acc[r·R + c] += x[r, :] · dequant(w[col0 + c, :]) for r < m, c < R: each 16-byte chunk of x
// is loaded once for R weight rows, and 8 weight words are in flight per lane. BITS 4 or 8,
// group a multiple of 32. Rows past n are clamped to n - 1 (computed, never stored).
template <class X, int BITS, int MR, int R>
__device__ __forceinline__ void qdot(const typename X::T* __restrict__ x, int m, i64 k, const unsigned* __restrict__ w,
                                     const void* s, const void* z, int sdt, i64 col0, i64 n, int group, float* acc,
                                     const float* __restrict__ xsum) {
  constexpr int VALS = 128 / BITS, PER = 32 / BITS, U = 8 / R;
  const int lane = threadIdx.x & 31;
  const i64 vecs = k / VALS, groups = k / group, wrow = k / PER;
  const int glog = group == 32 ? 5 : group == 64 ? 6 : 7;  // groups are 32, 64 or 128 values
  for (i64 v0 = 0; v0 < vecs; v0 += 32 * U) {
    uint4 q[U][R];
    float sc[U][R], bi[U][R];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const i64 v = v0 + u * 32 + lane;
#pragma unroll
      for (int c = 0; c < R; c++) {
        const i64 col = col0 + c < n ? col0 + c : n - 1;
        if (v < vecs) {
          q[u][c] = __ldcs((const uint4*)(w + col * wrow) + v);
          const i64 g = col * groups + ((v * VALS) >> glog);
          sc[u][c] = ldf(s, sdt, g);
          bi[u][c] = ldf(z, sdt, g);
        }
      }
    }
    // A programmatic launch (Gpu::launch_gemv): the first weights are on their way before the
    // kernel ahead, which wrote x, has ended.
    if (v0 == 0) pdl_wait();
#pragma unroll
    for (int u = 0; u < U; u++) {
      const i64 v = v0 + u * 32 + lane;
      if (v >= vecs) break;
#pragma unroll
      for (int r = 0; r < MR; r++) {
        if (r >= m) break;
        float xv[VALS];
#pragma unroll
        for (int c = 0; c < VALS / 8; c++) ldx8<X>(x + r * k + v * VALS + 8 * c, xv + 8 * c);
        float xs = 0.0f;
        if (xsum) {  // staged: the sums of each 16 values of x, made once per block
          xs = xsum[v * VALS / 16];
          if (VALS == 32) xs += xsum[v * VALS / 16 + 1];
        } else {
#pragma unroll
          for (int e = 0; e < VALS; e++) xs += xv[e];
        }
#pragma unroll
        for (int c = 0; c < R; c++) {
          const unsigned words[4] = {q[u][c].x, q[u][c].y, q[u][c].z, q[u][c].w};
          float dq = 0.0f;
#pragma unroll
          for (int wi = 0; wi < 4; wi++) {
            float wv[PER];
            qvals<BITS>(words[wi], wv);
#pragma unroll
            for (int e = 0; e < PER; e++) dq = fmaf(xv[wi * PER + e], wv[e], dq);
          }
          acc[r * R + c] = fmaf(sc[u][c], dq, fmaf(bi[u][c], xs, acc[r * R + c]));
        }
      }
    }
  }
}

// The same for a 16-bit weight type W.
template <class X, class W, int MR, int R>
__device__ __forceinline__ void ddot(const typename X::T* __restrict__ x, int m, i64 k,
                                     const unsigned short* __restrict__ w, i64 col0, i64 n, float* acc) {
  constexpr int U = 8 / R;
  const int lane = threadIdx.x & 31;
  const i64 vecs = k / 8;
  for (i64 v0 = 0; v0 < vecs; v0 += 32 * U) {
    uint4 q[U][R];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const i64 v = v0 + u * 32 + lane;
#pragma unroll
      for (int c = 0; c < R; c++) {
        const i64 col = col0 + c < n ? col0 + c : n - 1;
        if (v < vecs) q[u][c] = __ldcs((const uint4*)(w + col * k) + v);
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      const i64 v = v0 + u * 32 + lane;
      if (v >= vecs) break;
#pragma unroll
      for (int r = 0; r < MR; r++) {
        if (r >= m) break;
        float xv[8];
        ldx8<X>(x + r * k + v * 8, xv);
#pragma unroll
        for (int c = 0; c < R; c++) {
          float wv[8];
          unpack8<W>(q[u][c], wv);
#pragma unroll
          for (int e = 0; e < 8; e++) acc[r * R + c] = fmaf(xv[e], wv[e], acc[r * R + c]);
        }
      }
    }
  }
}

// The input of a GEMV (a tensor-core one, or a dense one that stages x) that computes
// x = rms_norm(a + b) · (w or 1 + w) itself while staging it (a null: x is given): the sum,
// rounded to x's dtype, is the residual stream, which block 0 writes to s. a, b and s in x's
// dtype; w in wdt. With pw set, b is first normalized itself, rms_norm(b) · (pw or 1 + pw)
// rounded to x's dtype (a sandwich norm: Gemma's post-attention and post-feed-forward norms).
struct NormIn {
  const void* a;
  const void* b;
  void* s;
  const void* w;
  int wdt;
  float eps;
  float off;
  const void* pw;
  int pwdt;
  float peps;
  float poff;
};
#define NORM_IN_PARAMS                                                                                                \
  const void *na, const void *nb, void *ns, const void *nw, int nwdt, float neps, int noff, const void *npw,          \
      int npwdt, float npeps, int npoff
#define NORM_IN NormIn{na, nb, ns, nw, nwdt, neps, noff ? 1.0f : 0.0f, npw, npwdt, npeps, npoff ? 1.0f : 0.0f}

// 1 / rms of a NormIn's b [k] where b is normalized first (pw set), else 1: a block-wide sum
// (every thread of the block calls it).
template <class X> __device__ __forceinline__ float norm_in_pre_inv(const NormIn& nin, i64 k) {
  if (!nin.pw) return 1.0f;
  float ss = 0.0f;
  for (i64 r = threadIdx.x; r < k / 8; r += blockDim.x) {
    float f[8];
    ldx8<X>((const typename X::T*)nin.b + 8 * r, f);
#pragma unroll
    for (int e = 0; e < 8; e++) ss += f[e] * f[e];
  }
  return rsqrtf(block_sum(ss) / (float)k + nin.peps);
}
// Values [8r, 8r + 8) of b as the residual sum reads them: b, or its norm (pinv from
// norm_in_pre_inv).
template <class X> __device__ __forceinline__ void norm_in_b(const NormIn& nin, float pinv, i64 r, float* fb) {
  ldx8<X>((const typename X::T*)nin.b + 8 * r, fb);
  if (!nin.pw) return;
#pragma unroll
  for (int e = 0; e < 8; e++) fb[e] = round_to(fb[e] * pinv * (ldf(nin.pw, nin.pwdt, 8 * r + e) + nin.poff), X::DT);
}

// The sum of each 16 values of the staged row xf [k], into xf [k ..): shared by the stagings.
__device__ __forceinline__ const float* stage_sums(float* xf, i64 k) {
  for (i64 c = threadIdx.x; c < k / 16; c += blockDim.x) {
    float t = 0.0f;
#pragma unroll
    for (int e = 0; e < 16; e++) t += xf[16 * c + e];
    xf[k + c] = t;
  }
  __syncthreads();
  return xf;
}

// One row of x as f32 in shared memory, followed by the sum of each 16 of its values, when the
// launch gave room for them (MLXCEL_GEMV_SMEM=1): every row a block computes then reads floats
// and sums made once per block instead of converting and summing x again for each weight row.
// Null: read x itself. Call before any early return (it synchronizes the block).
template <class X> __device__ __forceinline__ const float* stage_xf(const void* x, int m, i64 k) {
  extern __shared__ float4 staged[];
  float* xf = (float*)staged;
  unsigned smem;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(smem));
  if (m != 1 || k % 16 != 0 || (i64)smem < (k + k / 16) * 4) return nullptr;
  pdl_wait();  // a programmatic launch: x is the kernel ahead's
  for (i64 i = threadIdx.x; i < k / 8; i += blockDim.x) {
    float v[8];
    ldx8<X>((const typename X::T*)x + 8 * i, v);
    staged[2 * i] = make_float4(v[0], v[1], v[2], v[3]);
    staged[2 * i + 1] = make_float4(v[4], v[5], v[6], v[7]);
  }
  __syncthreads();
  return stage_sums(xf, k);
}

// stage_xf for x = rms_norm(a + b) · (w or 1 + w) made here from `nin` (a null nin.a: x given,
// and staged only where the launch gave room). The sum and the normalized row are each rounded
// to x's dtype, as the plain graph stores them; block 0 writes the sum to nin.s. With a NormIn
// the launch always gives room (k + k / 16 floats; k a multiple of 16).
template <class X>
__device__ __forceinline__ const float* stage_xf_in(const void* x, const NormIn& nin, int m, i64 k) {
  if (!nin.a) return stage_xf<X>(x, m, k);
  pdl_wait();
  extern __shared__ float4 staged[];
  float* xf = (float*)staged;
  typedef typename X::T T;
  const float pinv = norm_in_pre_inv<X>(nin, k);
  float ss = 0.0f;
  for (i64 i = threadIdx.x; i < k / 8; i += blockDim.x) {
    float a[8], b[8];
    ldx8<X>((const T*)nin.a + 8 * i, a);
    norm_in_b<X>(nin, pinv, i, b);
#pragma unroll
    for (int e = 0; e < 8; e++) {
      const float v = round_to(a[e] + b[e], X::DT);
      ss += v * v;
      xf[8 * i + e] = v;
      if (blockIdx.x == 0) X::st((T*)nin.s, 8 * i + e, v);
    }
  }
  const float inv = rsqrtf(block_sum(ss) / (float)k + nin.eps);  // block_sum syncs: xf is whole
  for (i64 i = threadIdx.x; i < k; i += blockDim.x)
    xf[i] = round_to(xf[i] * inv * (ldf(nin.w, nin.wdt, i) + nin.off), X::DT);
  __syncthreads();
  return stage_sums(xf, k);
}

// Warp w of the grid owns weight rows [w·R, w·R + R).
__device__ __forceinline__ i64 first_col(int r) { return ((i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * r; }

// y [m, n] = x [m, k] · dequant(w)ᵀ.
template <class X, int BITS, int MR, int R>
__device__ __forceinline__ void qgemv(const void* x, int m, const unsigned* w, const void* s, const void* z, int sdt,
                                      void* y, int ydt, i64 n, i64 k, int group) {
  const float* xf = MR == 1 ? stage_xf<X>(x, m, k) : nullptr;
  const i64 col0 = first_col(R);
  if (col0 >= n) return;
  float acc[MR * R];
#pragma unroll
  for (int i = 0; i < MR * R; i++) acc[i] = 0.0f;
  if (MR == 1 && xf) qdot<F32, BITS, 1, R>(xf, m, k, w, s, z, sdt, col0, n, group, acc, xf + k);
  else qdot<X, BITS, MR, R>((const typename X::T*)x, m, k, w, s, z, sdt, col0, n, group, acc, nullptr);
#pragma unroll
  for (int r = 0; r < MR; r++) {
    if (r >= m) break;
#pragma unroll
    for (int c = 0; c < R; c++) {
      const float v = warp_sum(acc[r * R + c]);
      if ((threadIdx.x & 31) == 0 && col0 + c < n) stf(y, ydt, r * n + col0 + c, v);
    }
  }
}

// act(g) · u for products rounded to gdt: `act` packs the activation's dtype code (low byte)
// and its unary_op code (elementwise.cu; SiLU 8, GELU 9, GELU-tanh 10) above it, and the
// activation is rounded to that dtype, as the plain graph stores it.
__device__ __forceinline__ float glu_out(float g, float u, int gdt, int act) {
  const float a = round_to(g, gdt), b = round_to(u, gdt);
  return round_to(unary_op(act >> 8, a, 0.0f), act & 0xff) * b;
}

// y = act(x·Gᵀ) · (x·Uᵀ) for two quantized weights of one shape (see glu_out).
template <class X, int BITS, int MR, int R>
__device__ __forceinline__ void qgemv_glu(const void* x, int m, const unsigned* wg, const void* sg, const void* zg,
                                          const unsigned* wu, const void* su, const void* zu, int sdt, void* y,
                                          int ydt, int gdt, int act, i64 n, i64 k, int group) {
  const float* xf = MR == 1 ? stage_xf<X>(x, m, k) : nullptr;
  const i64 col0 = first_col(R);
  if (col0 >= n) return;
  float g[MR * R], u[MR * R];
#pragma unroll
  for (int i = 0; i < MR * R; i++) { g[i] = 0.0f; u[i] = 0.0f; }
  if (MR == 1 && xf) {
    qdot<F32, BITS, 1, R>(xf, m, k, wg, sg, zg, sdt, col0, n, group, g, xf + k);
    qdot<F32, BITS, 1, R>(xf, m, k, wu, su, zu, sdt, col0, n, group, u, xf + k);
  } else {
    const typename X::T* xv = (const typename X::T*)x;
    qdot<X, BITS, MR, R>(xv, m, k, wg, sg, zg, sdt, col0, n, group, g, nullptr);
    qdot<X, BITS, MR, R>(xv, m, k, wu, su, zu, sdt, col0, n, group, u, nullptr);
  }
#pragma unroll
  for (int r = 0; r < MR; r++) {
    if (r >= m) break;
#pragma unroll
    for (int c = 0; c < R; c++) {
      const float out = glu_out(warp_sum(g[r * R + c]), warp_sum(u[r * R + c]), gdt, act);
      if ((threadIdx.x & 31) == 0 && col0 + c < n) stf(y, ydt, r * n + col0 + c, out);
    }
  }
}

template <class X, class W, int MR, int R>
__device__ __forceinline__ void dgemv(const void* x, int m, const void* w, void* y, int ydt, i64 n, i64 k) {
  const float* xf = MR == 1 ? stage_xf<X>(x, m, k) : nullptr;
  const i64 col0 = first_col(R);
  if (col0 >= n) return;
  float acc[MR * R];
#pragma unroll
  for (int i = 0; i < MR * R; i++) acc[i] = 0.0f;
  if (MR == 1 && xf) ddot<F32, W, 1, R>(xf, m, k, (const unsigned short*)w, col0, n, acc);
  else ddot<X, W, MR, R>((const typename X::T*)x, m, k, (const unsigned short*)w, col0, n, acc);
#pragma unroll
  for (int r = 0; r < MR; r++) {
    if (r >= m) break;
#pragma unroll
    for (int c = 0; c < R; c++) {
      const float v = warp_sum(acc[r * R + c]);
      if ((threadIdx.x & 31) == 0 && col0 + c < n) stf(y, ydt, r * n + col0 + c, v);
    }
  }
}

template <class X, class W, int MR, int R>
__device__ __forceinline__ void dgemv_glu(const void* x, int m, const void* wg, const void* wu, void* y, int ydt,
                                          int gdt, int act, i64 n, i64 k, const NormIn& nin) {
  const float* xf = MR == 1 ? stage_xf_in<X>(x, nin, m, k) : nullptr;
  const i64 col0 = first_col(R);
  if (col0 >= n) return;
  float g[MR * R], u[MR * R];
#pragma unroll
  for (int i = 0; i < MR * R; i++) { g[i] = 0.0f; u[i] = 0.0f; }
  if (MR == 1 && xf) {
    ddot<F32, W, 1, R>(xf, m, k, (const unsigned short*)wg, col0, n, g);
    ddot<F32, W, 1, R>(xf, m, k, (const unsigned short*)wu, col0, n, u);
  } else {
    ddot<X, W, MR, R>((const typename X::T*)x, m, k, (const unsigned short*)wg, col0, n, g);
    ddot<X, W, MR, R>((const typename X::T*)x, m, k, (const unsigned short*)wu, col0, n, u);
  }
#pragma unroll
  for (int r = 0; r < MR; r++) {
    if (r >= m) break;
#pragma unroll
    for (int c = 0; c < R; c++) {
      const float out = glu_out(warp_sum(g[r * R + c]), warp_sum(u[r * R + c]), gdt, act);
      if ((threadIdx.x & 31) == 0 && col0 + c < n) stf(y, ydt, r * n + col0 + c, out);
    }
  }
}

// A product's output with its bias b (in the output's dtype ydt; null: none) added as the plain
// graph adds it: to the product rounded to ydt.
__device__ __forceinline__ float with_bias(float v, const void* b, int ydt, i64 row) {
  return b ? round_to(v, ydt) + ldf(b, ydt, row) : v;
}

// Up to three dense products of one row of x (attention's q, k and v) in one launch: warp w of
// the grid computes row w of the weights taken in turn (n2 may be 0). x given, or made from a
// NormIn (staged; the launch gives room). A non-null b0/b1/b2 is that product's bias (in the
// output's dtype), added to the product rounded as the plain graph rounds it.
template <class X, class W>
__device__ __forceinline__ void dgemv3(const void* x, const void* w0, void* y0, i64 n0, const void* w1, void* y1,
                                       i64 n1, const void* w2, void* y2, i64 n2, int ydt, i64 k, const NormIn& nin,
                                       const void* b0, const void* b1, const void* b2) {
  const float* xf = nin.a ? stage_xf_in<X>(x, nin, 1, k) : nullptr;
  i64 row = first_col(1);
  const void* w = w0;
  const void* b = b0;
  void* y = y0;
  i64 n = n0;
  if (row >= n0 + n1) { row -= n0 + n1; w = w2; b = b2; y = y2; n = n2; }
  else if (row >= n0) { row -= n0; w = w1; b = b1; y = y1; n = n1; }
  if (row >= n) return;
  float acc[1] = {0.0f};
  if (xf) ddot<F32, W, 1, 1>(xf, 1, k, (const unsigned short*)w, row, n, acc);
  else ddot<X, W, 1, 1>((const typename X::T*)x, 1, k, (const unsigned short*)w, row, n, acc);
  const float v = with_bias(warp_sum(acc[0]), b, ydt, row);
  if ((threadIdx.x & 31) == 0) stf(y, ydt, row, v);
}
#define DGEMV3(XN, X, WN, W)                                                                                          \
  extern "C" __global__ void dgemv3_##XN##_##WN(const void* x, const void* w0, void* y0, i64 n0, const void* w1,      \
                                                 void* y1, i64 n1, const void* w2, void* y2, i64 n2, int ydt,         \
                                                 i64 k, NORM_IN_PARAMS, const void* b0, const void* b1,               \
                                                 const void* b2) {                                                    \
    dgemv3<X, W>(x, w0, y0, n0, w1, y1, n1, w2, y2, n2, ydt, k, NORM_IN, b0, b1, b2);                                \
  }
#define DGEMV3_X(XN, X) DGEMV3(XN, X, f16, F16) DGEMV3(XN, X, bf16, BF16)
DGEMV3_X(f32, F32)
DGEMV3_X(f16, F16)
DGEMV3_X(bf16, BF16)

// y [P, n]: pair p (of `pairs` = tokens · top) applies expert ids[p] (of `experts` stacked
// [experts · n, k] quantized weights) to its row of x (x_rows 1: the token's row; else row p):
// the routed-expert product at decode, blockIdx.y the pair, no host round trip for the ids.
template <class X, int BITS, int R>
__device__ __forceinline__ void gather_qgemv(const void* x, i64 x_rows, const unsigned* w, const void* s, const void* z,
                                             int sdt, const void* ids, int id_kind, void* y, int ydt, i64 top,
                                             i64 experts, i64 n, i64 k, int group, int* error, int tag) {
  const i64 p = blockIdx.y;
  const i64 e = ld_index(ids, id_kind, p);
  const i64 xr = (p / top) * x_rows + (x_rows == 1 ? 0 : p % top);
  const typename X::T* xrow = (const typename X::T*)x + xr * k;
  const float* xf = stage_xf<X>(xrow, 1, k);
  if (e < 0 || e >= experts) {
    if (threadIdx.x == 0 && blockIdx.x == 0) atomicCAS(error, 0, tag);
    return;
  }
  const i64 col0 = first_col(R);
  if (col0 >= n) return;
  const i64 rows = e * n, groups = k / group, ssz = sdt == 0 ? 4 : 2;
  const unsigned* we = w + rows * (k * BITS / 32);
  const void* se = (const char*)s + rows * groups * ssz;
  const void* ze = (const char*)z + rows * groups * ssz;
  float acc[R];
#pragma unroll
  for (int c = 0; c < R; c++) acc[c] = 0.0f;
  if (xf) qdot<F32, BITS, 1, R>(xf, 1, k, we, se, ze, sdt, col0, n, group, acc, xf + k);
  else qdot<X, BITS, 1, R>(xrow, 1, k, we, se, ze, sdt, col0, n, group, acc, nullptr);
#pragma unroll
  for (int c = 0; c < R; c++) {
    const float v = warp_sum(acc[c]);
    if ((threadIdx.x & 31) == 0 && col0 + c < n) stf(y, ydt, p * n + col0 + c, v);
  }
}

// The parameters of linalg.cu's gather_qmm, so one argument list launches either (x's dtype,
// the pair count and the bit width are in the name and the grid here).
#define GATHER_QGEMV(XN, X, BITS, R)                                                                                  \
  extern "C" __global__ void gather_qgemv_##XN##_##BITS##_1_##R(                                                      \
      const void* x, int, i64 x_rows, const unsigned* w, const void* s, const void* z, int sdt, const void* ids,      \
      int id_kind, void* y, int ydt, i64, i64 top, i64 experts, i64 n, i64 k, int, int group, int* error,             \
      int tag) {                                                                                                      \
    gather_qgemv<X, BITS, R>(x, x_rows, w, s, z, sdt, ids, id_kind, y, ydt, top, experts, n, k, group, error, tag);   \
  }
#define GATHER_QGEMV_X(XN, X)                                                                                         \
  GATHER_QGEMV(XN, X, 4, 1) GATHER_QGEMV(XN, X, 4, 2) GATHER_QGEMV(XN, X, 4, 4) GATHER_QGEMV(XN, X, 8, 1)             \
      GATHER_QGEMV(XN, X, 8, 2) GATHER_QGEMV(XN, X, 8, 4)
GATHER_QGEMV_X(f32, F32)
GATHER_QGEMV_X(f16, F16)
GATHER_QGEMV_X(bf16, BF16)

// ---- One row of x by dense 16-bit weights, loads first (decode of unquantized models) ---------
// A block of DSK_WARPS warps takes DSK_WARPS / G sets of rows, a set's G warps splitting k (G a
// power of two, so each lane has at most DSK_J 16-byte words of a row a batch: one batch for k
// up to 8·32·G·DSK_J). Each lane requests its first batch of words of all the set's NM matrices
// (1: a product; 2: a GLU's gate and up) before anything else, x staged after (rms_norm(a + b)
// made from a NormIn) or read as it is used, so a row of a few thousand values costs about one
// memory round trip, where the warp-a-row kernels (dgemv, dgemv_glu, dgemv3) took a round trip
// per 2048 values per matrix and another for the norm.
#define DSK_WARPS 8
#define DSK_J 4

// Lane sums of set rows into sums [DSK_WARPS / G][NM] (shared, whole after the call's last
// barrier): row `row` of w0 (and of w1, a GLU's up, for NM = 2), each [n, k], for this warp's
// set; row >= n sets compute nothing but reach every barrier.
template <class X, class W, int NM>
__device__ __forceinline__ void dsk_sums(const void* x, const NormIn& nin, const void* w0, const void* w1, i64 row,
                                         i64 n, i64 k, int G, float (*sums)[NM]) {
  __shared__ float part[DSK_WARPS][NM];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const i64 vecs = k / 8, step = 32 * G, first = (warp % G) * 32 + lane;
  const bool live = row < n;
  uint4 q[NM][DSK_J];
  auto fetch = [&](i64 v0) {
#pragma unroll
    for (int j = 0; j < DSK_J; j++) {
      const i64 v = v0 + j * step;
#pragma unroll
      for (int m = 0; m < NM; m++)
        if (live && v < vecs) q[m][j] = __ldcs((const uint4*)((const unsigned short*)(m ? w1 : w0) + row * k) + v);
    }
  };
  fetch(first);
  const float* xf = nin.a ? stage_xf_in<X>(x, nin, 1, k) : nullptr;
  float acc[NM];
#pragma unroll
  for (int m = 0; m < NM; m++) acc[m] = 0.0f;
  for (i64 v0 = first; live && v0 < vecs; v0 += step * DSK_J) {
#pragma unroll
    for (int j = 0; j < DSK_J; j++) {
      const i64 v = v0 + j * step;
      if (v >= vecs) break;
      float xv[8];
      if (xf) {
#pragma unroll
        for (int e = 0; e < 8; e++) xv[e] = xf[8 * v + e];
      } else {
        ldx8<X>((const typename X::T*)x + 8 * v, xv);
      }
#pragma unroll
      for (int m = 0; m < NM; m++) {
        float wv[8];
        unpack8<W>(q[m][j], wv);
#pragma unroll
        for (int e = 0; e < 8; e++) acc[m] = fmaf(xv[e], wv[e], acc[m]);
      }
    }
    if (v0 + step * DSK_J < vecs) fetch(v0 + step * DSK_J);
  }
#pragma unroll
  for (int m = 0; m < NM; m++) {
    const float t = warp_sum(acc[m]);
    if (lane == 0) part[warp][m] = t;
  }
  __syncthreads();
  if (threadIdx.x < DSK_WARPS / G * NM) {
    const int set = threadIdx.x / NM, m = threadIdx.x % NM;
    float t = 0.0f;
    for (int g = 0; g < G; g++) t += part[set * G + g][m];
    sums[set][m] = t;
  }
  __syncthreads();
}

// y [n] = x · Wᵀ (one row; x given).
template <class X, class W>
__device__ __forceinline__ void dsk_gemv(const void* x, const void* w, void* y, int ydt, i64 n, i64 k, int G) {
  __shared__ float sums[DSK_WARPS][1];
  const int sets = DSK_WARPS / G;
  const i64 row0 = (i64)blockIdx.x * sets;
  dsk_sums<X, W, 1>(x, NormIn{}, w, w, row0 + (threadIdx.x >> 5) / G, n, k, G, sums);
  if (threadIdx.x < sets && row0 + threadIdx.x < n) stf(y, ydt, row0 + threadIdx.x, sums[threadIdx.x][0]);
}

// y [n] = act(x·Gᵀ) · (x·Uᵀ) (see glu_out), x given or made from a NormIn.
template <class X, class W>
__device__ __forceinline__ void dsk_glu(const void* x, const void* wg, const void* wu, void* y, int ydt, int gdt,
                                        int act, i64 n, i64 k, int G, const NormIn& nin) {
  __shared__ float sums[DSK_WARPS][2];
  const int sets = DSK_WARPS / G;
  const i64 row0 = (i64)blockIdx.x * sets;
  dsk_sums<X, W, 2>(x, nin, wg, wu, row0 + (threadIdx.x >> 5) / G, n, k, G, sums);
  if (threadIdx.x < sets && row0 + threadIdx.x < n)
    stf(y, ydt, row0 + threadIdx.x, glu_out(sums[threadIdx.x][0], sums[threadIdx.x][1], gdt, act));
}

// Up to three products of one x (dgemv3's parameters and meaning: rows taken in turn, biases,
// x given or made from a NormIn), a set a row.
template <class X, class W>
__device__ __forceinline__ void dsk_gemv3(const void* x, const void* w0, void* y0, i64 n0, const void* w1, void* y1,
                                          i64 n1, const void* w2, void* y2, i64 n2, int ydt, i64 k, int G,
                                          const NormIn& nin, const void* b0, const void* b1, const void* b2) {
  __shared__ float sums[DSK_WARPS][1];
  const int sets = DSK_WARPS / G;
  // Set `set`'s matrix, output, bias and row within its matrix (n: that matrix's rows).
  auto locate = [&](int set, const void** w, void** y, const void** b, i64* row, i64* n) {
    *row = (i64)blockIdx.x * sets + set;
    *w = w0; *y = y0; *b = b0; *n = n0;
    if (*row >= n0 + n1) { *row -= n0 + n1; *w = w2; *y = y2; *b = b2; *n = n2; }
    else if (*row >= n0) { *row -= n0; *w = w1; *y = y1; *b = b1; *n = n1; }
  };
  const void *w, *b;
  void* y;
  i64 row, n;
  locate((threadIdx.x >> 5) / G, &w, &y, &b, &row, &n);
  dsk_sums<X, W, 1>(x, nin, w, w, row, n, k, G, sums);
  if (threadIdx.x < sets) {
    locate(threadIdx.x, &w, &y, &b, &row, &n);
    if (row < n) stf(y, ydt, row, with_bias(sums[threadIdx.x][0], b, ydt, row));
  }
}

#define DSK(XN, X, WN, W)                                                                                             \
  extern "C" __global__ void dsk_gemv_##XN##_##WN(const void* x, const void* w, void* y, int ydt, i64 n, i64 k,      \
                                                  int g) {                                                            \
    dsk_gemv<X, W>(x, w, y, ydt, n, k, g);                                                                            \
  }                                                                                                                   \
  extern "C" __global__ void dsk_glu_##XN##_##WN(const void* x, const void* wg, const void* wu, void* y, int ydt,     \
                                                 int gdt, int act, i64 n, i64 k, int g, NORM_IN_PARAMS) {             \
    dsk_glu<X, W>(x, wg, wu, y, ydt, gdt, act, n, k, g, NORM_IN);                                                     \
  }                                                                                                                   \
  extern "C" __global__ void dsk_gemv3_##XN##_##WN(const void* x, const void* w0, void* y0, i64 n0, const void* w1,  \
                                                   void* y1, i64 n1, const void* w2, void* y2, i64 n2, int ydt,       \
                                                   i64 k, int g, NORM_IN_PARAMS, const void* b0, const void* b1,      \
                                                   const void* b2) {                                                  \
    dsk_gemv3<X, W>(x, w0, y0, n0, w1, y1, n1, w2, y2, n2, ydt, k, g, NORM_IN, b0, b1, b2);                          \
  }
DSK(f16, F16, f16, F16)
DSK(f16, F16, bf16, BF16)
DSK(bf16, BF16, f16, F16)
DSK(bf16, BF16, bf16, BF16)

// Entry points `{family}_{x}_{variant}_{MR}_{R}`: qgemv/qglu (variant = bits), dgemv/dglu
// (variant = weight dtype); (MR, R) in {(1, 1), (1, 2), (1, 4), (8, 1)}.
#define QGEMV(XN, X, BITS, MR, R)                                                                                     \
  extern "C" __global__ void qgemv_##XN##_##BITS##_##MR##_##R(const void* x, int m, const unsigned* w,                \
                                                              const void* s, const void* z, int sdt, void* y,         \
                                                              int ydt, i64 n, i64 k, int group) {                     \
    qgemv<X, BITS, MR, R>(x, m, w, s, z, sdt, y, ydt, n, k, group);                                                   \
  }                                                                                                                   \
  extern "C" __global__ void qglu_##XN##_##BITS##_##MR##_##R(                                                         \
      const void* x, int m, const unsigned* wg, const void* sg, const void* zg, const unsigned* wu, const void* su,   \
      const void* zu, int sdt, void* y, int ydt, int gdt, int act, i64 n, i64 k, int group) {                     \
    qgemv_glu<X, BITS, MR, R>(x, m, wg, sg, zg, wu, su, zu, sdt, y, ydt, gdt, act, n, k, group);                  \
  }
#define QGEMV_SHAPES(XN, X, BITS)                                                                                     \
  QGEMV(XN, X, BITS, 1, 1) QGEMV(XN, X, BITS, 1, 2) QGEMV(XN, X, BITS, 1, 4) QGEMV(XN, X, BITS, 8, 1)
#define QGEMV_X(XN, X) QGEMV_SHAPES(XN, X, 4) QGEMV_SHAPES(XN, X, 8)
QGEMV_X(f32, F32)
QGEMV_X(f16, F16)
QGEMV_X(bf16, BF16)

#define DGEMV(XN, X, WN, W, MR, R)                                                                                    \
  extern "C" __global__ void dgemv_##XN##_##WN##_##MR##_##R(const void* x, int m, const void* w, void* y, int ydt,    \
                                                            i64 n, i64 k) {                                           \
    dgemv<X, W, MR, R>(x, m, w, y, ydt, n, k);                                                                        \
  }                                                                                                                   \
  extern "C" __global__ void dglu_##XN##_##WN##_##MR##_##R(const void* x, int m, const void* wg, const void* wu,      \
                                                           void* y, int ydt, int gdt, int act, i64 n, i64 k,     \
                                                           NORM_IN_PARAMS) {                                      \
    dgemv_glu<X, W, MR, R>(x, m, wg, wu, y, ydt, gdt, act, n, k, NORM_IN);                                        \
  }
#define DGEMV_SHAPES(XN, X, WN, W)                                                                                    \
  DGEMV(XN, X, WN, W, 1, 1) DGEMV(XN, X, WN, W, 1, 2) DGEMV(XN, X, WN, W, 1, 4) DGEMV(XN, X, WN, W, 8, 1)
#define DGEMV_X(XN, X) DGEMV_SHAPES(XN, X, f16, F16) DGEMV_SHAPES(XN, X, bf16, BF16)
DGEMV_X(f32, F32)
DGEMV_X(f16, F16)
DGEMV_X(bf16, BF16)

// ---- One row of x by 4-bit weights on the tensor cores (x in f16 or bf16) ----------------------
// A warp computes 16 weight rows over chunks of 256 values of k (the last may be 64-192) with
// mma.m16n8k16 (f32 accumulation). Each nibble becomes the 16-bit float off + q with one LOP3: the nibble under
// the exponent of `off` (1024 in f16, 128 in bf16), whose unit in the last place is 1, so the
// value is exact and the offset comes back out through the sum of x. x is staged in shared
// memory in its own dtype, each 8 values reordered (0,4,1,5,2,6,3,7) to match the nibble pairs
// (e, e+4) one mask extracts, with the f32 sum of each run of 32. The B operand carries x in
// column c only for the k slots of run c (the c-th 16-byte word of a weight row in the chunk;
// lane (g, t) loads words t and t + 4 of rows g and g + 8), so column c of the product is run
// c's dot product alone and each run keeps its own scale and bias whatever the group size.
// Warps of a block split k; the block sums them and writes its 16 outputs.

// (w & MASK) | MAGIC in one LOP3 (written apart, ptxas gives each constant an instruction).
template <unsigned MASK, unsigned MAGIC> __device__ __forceinline__ unsigned lop_or(unsigned w) {
  unsigned r;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(w), "n"(MASK), "n"(MAGIC));
  return r;
}

// ODD_IN_PLACE: nibbles 1, 3, 5 and 7 of a word are masked where they lie (bits 4-7 of each
// half) instead of shifted down, which makes them off + 16q: exact where the 16-bit type has
// room for 16q under off's exponent (f16's 10 mantissa bits; not bf16's 7). Their x is staged
// divided by 16 (and their offset in the run sums with it), so each product is unchanged.
template <class X> struct TensorCore;
template <> struct TensorCore<F16> {
  static constexpr int DT = 1;
  static constexpr unsigned MAGIC = 0x64006400u;
  static constexpr float OFF = 1024.0f;
  static constexpr bool ODD_IN_PLACE = true;
  static __device__ __forceinline__ void mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <> struct TensorCore<BF16> {
  static constexpr int DT = 2;
  static constexpr unsigned MAGIC = 0x43004300u;
  static constexpr float OFF = 128.0f;
  static constexpr bool ODD_IN_PLACE = false;
  static __device__ __forceinline__ void mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// The A values of nibble pair (e, e + 4) of w, e = 2h (even) or 2h + 1 (odd): off + q, or
// off + 16q for odd e under ODD_IN_PLACE. One shift (by 8) serves both pairs of a half word.
template <class X, bool ODD> __device__ __forceinline__ unsigned tc_nibbles(unsigned w) {
  typedef TensorCore<X> TC;
  if (!ODD) return lop_or<0x000F000Fu, TC::MAGIC>(w);
  if (TC::ODD_IN_PLACE) return lop_or<0x00F000F0u, TC::MAGIC>(w);
  return lop_or<0x000F000Fu, TC::MAGIC>(w >> 4);
}

// Most warps a tensor-core GEMV block has (its partial sums live in static shared memory).
#define TC_WARPS 16

// NM weights of one shape (1: a product; 2: gate and up of a GLU) applied to x [k]: lane
// (g, t) of each warp ends with the dot products of rows a = row0 + g and b = a + bstride (8
// unless a rope's pairs need others, tc_qgemv3_rope); the block's warps are summed and thread
// i < 16 returns row a's (i = g) or row b's (i = g + 8) in out[m]. The tile-packed layout takes
// bstride 8 only. x is staged when `stage`
// (a block's first tile; its later tiles reuse it). A warp's first chunk of weights (with DB,
// its first two) is requested before x is staged. (Measured slower on the H200: requesting the next
// chunk before computing the current one, and four independent mma accumulator chains.)

// 8 16-bit values (0..7) in the order (0,4,1,5,2,6,3,7), the nibble pairs' that one mask of a
// packed 4-bit word extracts.
__device__ __forceinline__ uint4 pairs_order(uint4 v) {
  return make_uint4(__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.x, v.z, 0x7632), __byte_perm(v.y, v.w, 0x5410),
                    __byte_perm(v.y, v.w, 0x7632));
}

// 8 values of x (in x's dtype) into xs's order (0,4,1,5,2,6,3,7), adding them to *sum, and to
// *osum as the mma sees them: under ODD_IN_PLACE the odd values (words y and w) are divided by
// 16 (exact but where that makes an f16 subnormal), and the offsets' sum is then not x's.
template <class X> __device__ __forceinline__ uint4 tc_stage_word(uint4 v, float* sum, float* osum) {
  float f[8];
  unpack8<X>(v, f);
#pragma unroll
  for (int e = 0; e < 8; e++) *sum += f[e];
  uint4 o = pairs_order(v);
  if (TensorCore<X>::ODD_IN_PLACE) {  // f16 only: 0x2C00 is 1/16
    const unsigned sixteenth = 0x2C002C00u;
    asm("mul.rn.f16x2 %0, %0, %1;" : "+r"(o.y) : "r"(sixteenth));
    asm("mul.rn.f16x2 %0, %0, %1;" : "+r"(o.w) : "r"(sixteenth));
    unpack8<X>(o, f);
  }
#pragma unroll
  for (int e = 0; e < 8; e++) *osum += f[e];
  return o;
}

// One 32-bit word of each of rows a and b (8 nibbles: k slots e and e + 4 in each half)
// through two mma against xb, x's B fragment for those slots, into the run sums c.
template <class X>
__device__ __forceinline__ void tc_mma_word(float* c, unsigned wa, unsigned wb, uint4 xb) {
  typedef TensorCore<X> TC;
  unsigned a[4];
  a[0] = tc_nibbles<X, false>(wa);
  a[1] = tc_nibbles<X, false>(wb);
  a[2] = tc_nibbles<X, true>(wa);
  a[3] = tc_nibbles<X, true>(wb);
  TC::mma(c, a, xb.x, xb.y);
  wa >>= 8, wb >>= 8;
  a[0] = tc_nibbles<X, false>(wa);
  a[1] = tc_nibbles<X, false>(wb);
  a[2] = tc_nibbles<X, true>(wa);
  a[3] = tc_nibbles<X, true>(wb);
  TC::mma(c, a, xb.z, xb.w);
}

// A chunk's run sums c (runs r0 and r0 + 1 of rows a and b, each q off the offset) into the two
// row sums acc: scale (sc) and bias (bi) of each run, s0 and s1 the sums of x over the runs,
// o0 and o1 those of the offsets' factors (tc_stage_word).
template <class X>
__device__ __forceinline__ void tc_scale_runs(float* acc, const float* c, const float* sc, const float* bi, float s0,
                                              float s1, float o0, float o1) {
  typedef TensorCore<X> TC;
  acc[0] += sc[0] * (c[0] - TC::OFF * o0) + bi[0] * s0;
  acc[0] += sc[1] * (c[1] - TC::OFF * o1) + bi[1] * s1;
  acc[1] += sc[2] * (c[2] - TC::OFF * o0) + bi[2] * s0;
  acc[1] += sc[3] * (c[3] - TC::OFF * o1) + bi[3] * s1;
}

// x [k] staged for tc_qdot: xs (k / 8 reordered words), xsum (k / 32 run sums) and after them
// the k / 32 sums of the offsets' factors (tc_stage_word), from x itself or from rms_norm(a + b)
// (see NormIn). Ends with a block barrier.
template <class X>
__device__ __forceinline__ void tc_stage_x(const void* x, const NormIn& nin, i64 k, uint4* xs, float* xsum) {
  typedef TensorCore<X> TC;
  if (!nin.a) {
    for (i64 r = threadIdx.x; r < k / 32; r += blockDim.x) {
      float sum = 0.0f, osum = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; i++) xs[4 * r + i] = tc_stage_word<X>(((const uint4*)x)[4 * r + i], &sum, &osum);
      xsum[r] = sum, xsum[k / 32 + r] = osum;
    }
    __syncthreads();
    return;
  }
  union Word { uint4 u; typename X::T h[8]; };
  const float pinv = norm_in_pre_inv<X>(nin, k);
  float ss = 0.0f;
  for (i64 r = threadIdx.x; r < k / 8; r += blockDim.x) {
    float fa[8], fb[8];
    unpack8<X>(((const uint4*)nin.a)[r], fa);
    norm_in_b<X>(nin, pinv, r, fb);
    Word sw;
#pragma unroll
    for (int e = 0; e < 8; e++) {
      const float v = round_to(fa[e] + fb[e], TC::DT);  // the sum as stored
      ss += v * v;
      X::st(sw.h, e, v);
    }
    xs[r] = sw.u;
    if (blockIdx.x == 0) ((uint4*)nin.s)[r] = sw.u;
  }
  const float inv = rsqrtf(block_sum(ss) / (float)k + nin.eps);  // block_sum syncs: xs is whole
  for (i64 r = threadIdx.x; r < k / 32; r += blockDim.x) {
    float sum = 0.0f, osum = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      float f[8];
      unpack8<X>(xs[4 * r + i], f);
      Word yw;
#pragma unroll
      for (int e = 0; e < 8; e++) X::st(yw.h, e, f[e] * inv * (ldf(nin.w, nin.wdt, 32 * r + 8 * i + e) + nin.off));
      xs[4 * r + i] = tc_stage_word<X>(yw.u, &sum, &osum);
    }
    xsum[r] = sum, xsum[k / 32 + r] = osum;
  }
  __syncthreads();
}

// The block's sum of each warp's row sums acc (lane (g, t) holds rows g and g + 8 of its
// warp's share of k): thread i < 16 gets row i's in out[m]. Synchronizes the block once; the
// caller synchronizes again before wpart is written anew.
template <int NM>
__device__ __forceinline__ void tc_block_sum(const float (*acc)[2], float (*wpart)[NM][16], float* out) {
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int m = 0; m < NM; m++) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
      float v = acc[m][h];
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      if (t == 0) wpart[warp][m][g + 8 * h] = v;
    }
  }
  __syncthreads();
  if (threadIdx.x < 16) {
#pragma unroll
    for (int m = 0; m < NM; m++) {
      float v = 0.0f;
      for (int i = 0; i < warps; i++) v += wpart[i][m][threadIdx.x];
      out[m] = v;
    }
  }
}

// The tile-packed layout of a 4-bit weight (crates/cuda/src/pack.rs writes it; n a multiple of 16, k of
// 256), flagged by Q4_PACKED in a launch's group argument: each 16-row tile's chunks of 256
// values one after another, a chunk 2 KB in four 512-byte slots (row a's word t, row b's word t,
// row a's word t + 4, row b's word t + 4 of lane (g, t), rows a = g and b = g + 8), so each of a
// warp's loads is 512 contiguous bytes and a tile is one contiguous run. Scales and biases
// follow the same order: each chunk's 16 rows of 256 / group values, row by row.
#define Q4_PACKED (1 << 16)
template <class X, int NM, bool DB = false>
__device__ __forceinline__ void tc_qdot(const void* x, const NormIn& nin, bool stage, const unsigned* const* w,
                                        const void* const* s, const void* const* z, int sdt, i64 row0, i64 n,
                                        i64 k, int group, float* out, i64 bstride = 8) {
  typedef TensorCore<X> TC;
  extern __shared__ float4 staged[];
  uint4* xs = (uint4*)staged;              // k / 8 words of 8 reordered values
  float* xsum = (float*)(staged + k / 8);  // k / 32 run sums, then k / 32 offset sums
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int mine = g == t ? 0 : g == t + 4 ? 1 : -1;  // which of its two words feeds B (column g)
  // k a multiple of 64: where it is not one of 256, the last chunk is partial (its runs 0-1,
  // 0-3 or 0-5; the lanes of the runs past k load and feed zeros, and where it has at most four
  // runs the second mma of each pair sits it out).
  const bool packed = group & Q4_PACKED;
  group &= Q4_PACKED - 1;
  const i64 wrow = k / 8, groups = k / group, runs = k / 32, chunks = (k + 255) / 256;
  // Groups are 32, 64 or 128 values: run r (32 values) is in group r >> gshift.
  const int gshift = group == 32 ? 0 : group == 64 ? 1 : 2;
  struct Chunk {
    uint4 q[NM][2][2];  // [matrix][row a, b][word t, t + 4]
    unsigned sb[NM][4];   // each matrix's four 16-bit scale | bias pairs
  };
  // This lane's rows a and b of the tile (clamped to the last row), as offsets of their first
  // packed word and first group, made once: the chunk loop only adds the chunk's.
  // 32-bit: the launch keeps n · k / 8 below 2^32.
  const i64 ra = row0 + g < n ? row0 + g : n - 1, rb = row0 + g + bstride < n ? row0 + g + bstride : n - 1;
  const unsigned wa = (unsigned)(ra * wrow), wb = (unsigned)(rb * wrow);
  const unsigned ga = (unsigned)(ra * groups), gb = (unsigned)(rb * groups);
  const int iruns = (int)runs;
  // Where of chunk c this lane's scales and biases are: runs 2t and 2t + 1 of rows a and b.
  auto scale_at = [&](i64 c, i64* at) {
    if (packed) {
      const int per = 8 >> gshift;  // groups a chunk row
      const i64 rows = ((row0 >> 4) * chunks + c) * 16;
      const int g0 = (2 * t) >> gshift, g1 = (2 * t + 1) >> gshift;
      at[0] = (rows + g) * per + g0, at[1] = (rows + g) * per + g1;
      at[2] = (rows + g + 8) * per + g0, at[3] = (rows + g + 8) * per + g1;
      return;
    }
    const int run = (int)c * 8 + 2 * t;
    const unsigned g0 = run < iruns ? run >> gshift : 0, g1 = run < iruns ? (run + 1) >> gshift : 0;
    at[0] = ga + g0, at[1] = ga + g1, at[2] = gb + g0, at[3] = gb + g1;
  };
  // 16-bit scales and biases are requested with the chunk's words, a scale and its bias in one
  // register, and converted where they are used, so neither load waits for the other (f32 ones,
  // which would need twice the registers, are loaded where they are used).
  auto fetch = [&](i64 c, Chunk& b) {  // chunk c's words (and 16-bit scales and biases) into b
    uint4 (&q)[NM][2][2] = b.q;
    unsigned (&sb)[NM][4] = b.sb;
#pragma unroll
    for (int m = 0; m < NM; m++) {
      if (packed) {
        const uint4* p = (const uint4*)w[m] + ((row0 >> 4) * chunks + c) * 128 + lane;
        q[m][0][0] = __ldcs(p);
        q[m][1][0] = __ldcs(p + 32);
        q[m][0][1] = __ldcs(p + 64);
        q[m][1][1] = __ldcs(p + 96);
        continue;
      }
      const unsigned word = (unsigned)c * 32 + 4 * t;  // this lane's first word of chunk c
      const uint4* pa = (const uint4*)(w[m] + (wa + word));
      const uint4* pb = (const uint4*)(w[m] + (wb + word));
      if ((int)c * 8 + 8 <= iruns) {  // a whole chunk (uniform across the warp): no lane's word is past k
        q[m][0][0] = __ldcs(pa);
        q[m][0][1] = __ldcs(pa + 4);
        q[m][1][0] = __ldcs(pb);
        q[m][1][1] = __ldcs(pb + 4);
        continue;
      }
      const bool in0 = (int)c * 8 + t < iruns, in1 = (int)c * 8 + t + 4 < iruns;  // words t and t + 4 within k
      const uint4 zero = make_uint4(0, 0, 0, 0);
      q[m][0][0] = in0 ? __ldcs(pa) : zero;
      q[m][0][1] = in1 ? __ldcs(pa + 4) : zero;
      q[m][1][0] = in0 ? __ldcs(pb) : zero;
      q[m][1][1] = in1 ? __ldcs(pb + 4) : zero;
    }
    if (sdt == 0) return;
    i64 at[4];
    scale_at(c, at);
    if (packed) {
#pragma unroll
      for (int m = 0; m < NM; m++)
#pragma unroll
        for (int i = 0; i < 4; i++)
          sb[m][i] = ((const unsigned short*)s[m])[at[i]] | (unsigned)((const unsigned short*)z[m])[at[i]] << 16;
      return;
    }
    // Runs 2t and 2t + 1 are one group at groups of 64 or 128 (one 16-bit load of the row's
    // scale and one of its bias), groups 2t and 2t + 1 at 32: adjacent, so one 32-bit load each
    // where the arrays are 4-byte aligned (at[0] is even: k / 32 groups a row, and run even).
#pragma unroll
    for (int m = 0; m < NM; m++) {
      const unsigned short *sm = (const unsigned short*)s[m], *zm = (const unsigned short*)z[m];
      const bool pairs = gshift == 0 && (((size_t)sm | (size_t)zm) & 3) == 0;
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const i64 i = at[2 * h];
        if (pairs) {
          const unsigned sp = ((const unsigned*)sm)[i >> 1], zp = ((const unsigned*)zm)[i >> 1];
          sb[m][2 * h] = __byte_perm(sp, zp, 0x5410), sb[m][2 * h + 1] = __byte_perm(sp, zp, 0x7632);
        } else if (gshift == 0) {
          sb[m][2 * h] = sm[i] | (unsigned)zm[i] << 16;
          sb[m][2 * h + 1] = sm[i + 1] | (unsigned)zm[i + 1] << 16;
        } else {
          sb[m][2 * h] = sb[m][2 * h + 1] = sm[i] | (unsigned)zm[i] << 16;
        }
      }
    }
  };
  float acc[NM][2];
#pragma unroll
  for (int m = 0; m < NM; m++) acc[m][0] = acc[m][1] = 0.0f;
  // Chunk c of b into acc.
  auto product = [&](i64 c, const Chunk& b) {
    const uint4 (&q)[NM][2][2] = b.q;
    const unsigned (&sb)[NM][4] = b.sb;
    // This lane's outputs: runs 2t and 2t + 1 of the chunk, rows a and b (none past k in a
    // partial chunk; runs is even, so run + 1 is in when run is).
    const i64 run = c * 8 + 2 * t;
    const bool in = run < runs;
    const float s0 = in ? xsum[run] : 0.0f, s1 = in ? xsum[run + 1] : 0.0f;
    const float o0 = in ? xsum[runs + run] : 0.0f, o1 = in ? xsum[runs + run + 1] : 0.0f;
    float cc[NM][4];
#pragma unroll
    for (int m = 0; m < NM; m++) cc[m][0] = cc[m][1] = cc[m][2] = cc[m][3] = 0.0f;
#pragma unroll
    for (int u = 0; u < 2; u++) {
      if (u == 1 && c * 8 + 4 >= runs) break;  // uniform across the warp
      // B's column g: run g of the chunk, from the lane whose word it is (zeros past k).
      const bool feeds = u == mine && c * 8 + t + 4 * u < runs;
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const uint4 xb = feeds ? xs[c * 32 + 4 * (t + 4 * u) + j] : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int m = 0; m < NM; m++)
          tc_mma_word<X>(cc[m], ((const unsigned*)&q[m][0][u])[j], ((const unsigned*)&q[m][1][u])[j], xb);
      }
    }
    float sc[NM][4], bi[NM][4];
    if (sdt != 0) {
#pragma unroll
      for (int m = 0; m < NM; m++)
#pragma unroll
        for (int i = 0; i < 4; i++) sc[m][i] = bits_float(sb[m][i] & 0xffffu, sdt), bi[m][i] = bits_float(sb[m][i] >> 16, sdt);
    } else {
      i64 at[4];
      scale_at(c, at);
#pragma unroll
      for (int m = 0; m < NM; m++)
#pragma unroll
        for (int i = 0; i < 4; i++) sc[m][i] = ldf(s[m], 0, at[i]), bi[m][i] = ldf(z[m], 0, at[i]);
    }
#pragma unroll
    for (int m = 0; m < NM; m++)
      if (in) tc_scale_runs<X>(acc[m], cc[m], sc[m], bi[m], s0, s1, o0, o1);
  };
  // DB: two chunks in flight, both of the first two requested before x is staged (where the
  // norm in front takes a block-wide sum and two trips to L2, all of a warp's weights of a
  // k = 8 · 256 · warps tile are on their way meanwhile), then the next one's loads out while
  // this one's products run.
  Chunk a, b;
  if (stage) pdl_trigger();
  if (warp < chunks) fetch(warp, a);
  if (DB && warp + warps < chunks) fetch(warp + warps, b);
  if (stage) {
    pdl_wait();  // a programmatic launch: the weights were requested before the kernel ahead ended
    tc_stage_x<X>(x, nin, k, xs, xsum);
  }
  if (!DB) {
    for (i64 c = warp; c < chunks; c += warps) {
      product(c, a);
      if (c + warps < chunks) fetch(c + warps, a);
    }
  } else {
    for (i64 c = warp; c < chunks; c += 2 * warps) {
      product(c, a);
      if (c + warps >= chunks) break;
      if (c + 2 * warps < chunks) fetch(c + 2 * warps, a);
      product(c + warps, b);
      if (c + 3 * warps < chunks) fetch(c + 3 * warps, b);
    }
  }
  __shared__ float wpart[TC_WARPS][NM][16];
  tc_block_sum<NM>(acc, wpart, out);
  __syncthreads();  // the block's next tile reuses wpart
}

// Register bounds: at 64 registers a thread two 512-thread (four 256-thread) blocks fit an SM,
// at 66 (what ptxas takes unbounded since the half chunk) one (three). Bounded, llama-3.1-8b
// decodes 270 tok/s against 248 (the down projection 44.7 µs against 59.3); the launch picks
// the unbounded _r0 variant for small blocks. The GLU (106-120 registers) measured slower
// capped at 96/80/64 registers (which spill): 263/258/256 tok/s against 270.
#define TC_GEMV_CAP __launch_bounds__(512, 2)

// Up to three products of one x (attention's q, k and v) in one launch: the blocks run over the
// 16-row tiles of each weight in turn (each n a multiple of 16). Same scale and output dtypes;
// x given or computed from a NormIn; a non-null b0/b1/b2 is that product's bias (with_bias).
#define TC_QGEMV3(XN, X, SUF, CAP)                                                                                    \
  extern "C" __global__ void CAP tc_qgemv3_##XN##_4##SUF(                                                             \
      const void* x, const unsigned* w0, const void* s0, const void* z0, void* y0, i64 n0, const unsigned* w1,        \
      const void* s1, const void* z1, void* y1, i64 n1, const unsigned* w2, const void* s2, const void* z2,           \
      void* y2, i64 n2, int sdt, int ydt, i64 k, int group, NORM_IN_PARAMS, const void* b0, const void* b1,           \
      const void* b2) {                                                                                               \
    const i64 tiles = (n0 + n1 + n2) / 16;                                                                            \
    for (i64 tile = blockIdx.x; tile < tiles; tile += gridDim.x) {                                                    \
      i64 row0 = tile * 16;                                                                                           \
      const unsigned* w = w0;                                                                                         \
      const void *s = s0, *z = z0, *b = b0;                                                                           \
      void* y = y0;                                                                                                   \
      i64 n = n0;                                                                                                     \
      if (row0 >= n0 + n1) { row0 -= n0 + n1; w = w2; s = s2; z = z2; b = b2; y = y2; n = n2; }                       \
      else if (row0 >= n0) { row0 -= n0; w = w1; s = s1; z = z1; b = b1; y = y1; n = n1; }                            \
      float out[1];                                                                                                   \
      tc_qdot<X, 1>(x, NORM_IN, tile == blockIdx.x, &w, &s, &z, sdt, row0, n, k, group, out);                         \
      const i64 row = row0 + threadIdx.x;                                                                             \
      if (threadIdx.x < 16 && row < n) stf(y, ydt, row, with_bias(out[0], b, ydt, row));                              \
    }                                                                                                                 \
  }
TC_QGEMV3(f16, F16, , TC_GEMV_CAP)
TC_QGEMV3(bf16, BF16, , TC_GEMV_CAP)
TC_QGEMV3(f16, F16, _r0, )
TC_QGEMV3(bf16, BF16, _r0, )

// The parameter lists of qgemv and qglu (m must be 1; k a multiple of 64; blockDim.x at most
// 32 · TC_WARPS; dynamic shared memory k · 2 + k / 4 bytes), tc_qglu's followed by a NormIn's.
#define TC_QGEMV(XN, X, SUF, CAP)                                                                                     \
  extern "C" __global__ void CAP tc_qgemv_##XN##_4##SUF(const void* x, int, const unsigned* w, const void* s,         \
                                               const void* z, int sdt, void* y, int ydt, i64 n, i64 k,                \
                                               int group) {                                                           \
    const unsigned* ws[1] = {w};                                                                                      \
    const void* ss[1] = {s};                                                                                          \
    const void* zs[1] = {z};                                                                                          \
    float out[1];                                                                                                     \
    for (i64 tile = blockIdx.x; tile * 16 < n; tile += gridDim.x) {                                                   \
      const i64 row0 = tile * 16;                                                                                     \
      tc_qdot<X, 1>(x, NormIn{}, tile == blockIdx.x, ws, ss, zs, sdt, row0, n, k, group, out);                        \
      if (threadIdx.x < 16 && row0 + threadIdx.x < n) stf(y, ydt, row0 + threadIdx.x, out[0]);                        \
    }                                                                                                                 \
  }
#define TC_QGLU(XN, X, SUF, DB)                                                                                        \
  extern "C" __global__ void tc_qglu_##XN##_4##SUF(const void* x, int, const unsigned* wg, const void* sg,             \
                                              const void* zg, const unsigned* wu, const void* su, const void* zu,     \
                                              int sdt, void* y, int ydt, int gdt, int act, i64 n, i64 k,          \
                                              int group, NORM_IN_PARAMS) {                                            \
    const unsigned* ws[2] = {wg, wu};                                                                                 \
    const void* ss[2] = {sg, su};                                                                                     \
    const void* zs[2] = {zg, zu};                                                                                     \
    float out[2];                                                                                                     \
    for (i64 tile = blockIdx.x; tile * 16 < n; tile += gridDim.x) {                                                   \
      const i64 row0 = tile * 16;                                                                                     \
      tc_qdot<X, 2, DB>(x, NORM_IN, tile == blockIdx.x, ws, ss, zs, sdt, row0, n, k, group, out);                      \
      if (threadIdx.x < 16 && row0 + threadIdx.x < n)                                                                 \
        stf(y, ydt, row0 + threadIdx.x, glu_out(out[0], out[1], gdt, act));                                           \
    }                                                                                                                 \
  }
TC_QGEMV(f16, F16, , TC_GEMV_CAP)
TC_QGEMV(bf16, BF16, , TC_GEMV_CAP)
TC_QGEMV(f16, F16, _r0, )
TC_QGEMV(bf16, BF16, _r0, )
TC_QGLU(f16, F16, , false)
TC_QGLU(bf16, BF16, , false)
TC_QGLU(f16, F16, _db, true)
TC_QGLU(bf16, BF16, _db, true)

// ---- The same products with each warp's weights streamed through shared memory -----------------
// tc_qdot has one chunk of a warp's weights in flight (in its registers) and drains at every
// tile. Here a warp walks one sequence (its chunks of each of its block's tiles in turn) and
// cp.async keeps the next `ring - 1` of it in flight in shared memory, scales and biases with
// them, while the tensor cores run on the current one; a tile boundary does not stop the copies.
// A matrix's share of a stage: 16 rows x 8 words of 16 bytes (word j of row r at slot
// j ^ 4(r & 1), so the lanes of a quarter warp, reading words t and t + 4 of rows g and g + 1,
// hit distinct banks), then the 16 rows' scales and their biases (srow bytes a row: the chunk's
// 256 / group values). Scale rows must start on 4 bytes ((k / group) · size a multiple of 4).

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
// Waits until at most n (0-7) of this thread's copy groups are pending.
__device__ __forceinline__ void cp_async_wait(int n) {
  switch (n) {
    case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;" ::: "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 7;" ::: "memory"); break;
  }
}

// One weight of a ring product: packed words, scales, biases.
struct QMat {
  const unsigned* w;
  const void* s;
  const void* z;
};

// The row tiles of up to three stacked products of one x (rows n[0], n[1], n[2] in turn, each a
// multiple of 16 but the last): tile t's product and its first row there.
struct Parts {
  i64 n[3];
  __device__ __forceinline__ int locate(i64 tile, i64* row0) const {
    i64 r = tile * 16;
    if (r < n[0]) { *row0 = r; return 0; }
    r -= n[0];
    if (r < n[1]) { *row0 = r; return 1; }
    *row0 = r - n[1];
    return 2;
  }
};

// NM weights of one shape a tile (NM 2: a GLU's gate and up, mats[0] and mats[1]; NM 1:
// mats[part] of three, one a part) applied to x [k] (given, or rms_norm(a + b) as NormIn says); epi(part,
// row, out[0], out[NM - 1]) stores row `row` of the part (threads < 16). Dynamic shared memory: x staged as
// tc_qdot stages it (2k + k/4 bytes, rounded up to 16), then each warp's `ring` stages.
template <class X, int NM, class Epi>
__device__ __forceinline__ void tc_qring(const void* x, const NormIn& nin, const QMat* mats, const Parts& parts,
                                         int sdt, i64 k, int group, int ring, Epi epi) {
  typedef TensorCore<X> TC;
  extern __shared__ float4 staged[];
  uint4* xs = (uint4*)staged;
  float* xsum = (float*)(staged + k / 8);
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int mine = g == t ? 0 : g == t + 4 ? 1 : -1;
  const int ssz = sdt == 0 ? 4 : 2, srow = (256 / group) * ssz, mbytes = 2048 + 32 * srow;
  unsigned char* base = (unsigned char*)staged + (2 * k + k / 4 + 15) / 16 * 16 + (i64)warp * ring * NM * mbytes;
  const i64 wrow = k / 8, groups = k / group, runs = k / 32, chunks = (k + 255) / 256;
  const bool half_last = k % 256 != 0;
  const i64 tiles = (parts.n[0] + parts.n[1] + parts.n[2] + 15) / 16;
  const i64 nc = (chunks - warp + warps - 1) / warps;  // this warp's chunks of a tile (warps <= chunks)
  const i64 mytiles = tiles > blockIdx.x ? (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  const i64 items = mytiles * nc;
  // The warp's sequence: chunks warp, warp + warps, ... of tile blockIdx.x, then of the tiles
  // gridDim.x on. Cursors (no divisions in the loop): the next item to copy, its stage.
  i64 inext = 0, itile = blockIdx.x, ichunk = warp;
  int islot = 0;
  const int sshift = __ffs(srow / 4) - 1;  // log2 of a full chunk's 4-byte scale words a row (1-8)
  auto issue = [&]() {
    if (inext < items) {
      const i64 tile = itile, c = ichunk;
      i64 row0;
      const int part = parts.locate(tile, &row0);
      const i64 n = parts.n[part];
      const bool full = !half_last || c + 1 < chunks;
      const int sh = full ? sshift : sshift - 1, sw = 1 << sh;  // 4-byte scale words a row here
      unsigned char* st = base + islot * NM * mbytes;
#pragma unroll
      for (int m = 0; m < NM; m++) {
        // (compile-time indices only: a run-time one would put mats in local memory)
        const QMat q = NM == 2 ? mats[m] : part == 0 ? mats[0] : part == 1 ? mats[1] : mats[2];
        unsigned char* sm = st + m * mbytes;
#pragma unroll
        for (int i = 0; i < 4; i++) {
          const int idx = i * 32 + lane, r = idx >> 3, j = idx & 7;
          const i64 row = row0 + r < n ? row0 + r : n - 1;
          if (full || j < 4) cp_async16(sm + r * 128 + ((j ^ ((r & 1) << 2)) << 4), (const uint4*)(q.w + row * wrow) + c * 8 + j);
        }
        for (int i = lane; i < 16 * sw; i += 32) {
          const int r = i >> sh, j = i & (sw - 1);
          const i64 row = row0 + r < n ? row0 + r : n - 1;
          const i64 off = row * groups * ssz + c * srow + 4 * j;
          cp_async4(sm + 2048 + r * srow + 4 * j, (const unsigned char*)q.s + off);
          cp_async4(sm + 2048 + 16 * srow + r * srow + 4 * j, (const unsigned char*)q.z + off);
        }
      }
      ichunk += warps;
      if (ichunk >= chunks) { ichunk = warp; itile += gridDim.x; }
    }
    cp_async_commit();
    inext++;
    islot = islot + 1 == ring ? 0 : islot + 1;
  };
  pdl_trigger();
  for (int f = 0; f + 1 < ring; f++) issue();  // weights only: they do not wait for the kernel before
  pdl_wait();
  tc_stage_x<X>(x, nin, k, xs, xsum);
  __shared__ float wpart[TC_WARPS][NM][16];
  float acc[NM][2];
#pragma unroll
  for (int m = 0; m < NM; m++) acc[m][0] = acc[m][1] = 0.0f;
  const int lg0 = 2 * t * 32 / group, lg1 = (2 * t + 1) * 32 / group;  // this lane's groups in a chunk
  i64 ctile = blockIdx.x, c = warp;  // the item to compute and its stage
  int cslot = 0;
  for (i64 f = 0; f < items; f++) {
    __syncwarp();  // every lane is done with the stage item f - 1 read, which the next copy takes
    issue();
    cp_async_wait(ring - 1);
    __syncwarp();
    const bool full = !half_last || c + 1 < chunks;
    const i64 run = c * 8 + 2 * t;
    const bool in = run < runs;
    const unsigned char* st = base + cslot * NM * mbytes;
    cslot = cslot + 1 == ring ? 0 : cslot + 1;
    float sc[NM][4], bi[NM][4];
#pragma unroll
    for (int m = 0; m < NM; m++) {
      const unsigned char* sp = st + m * mbytes + 2048;
      const unsigned char* zp = sp + 16 * srow;
      sc[m][0] = ldf(sp + g * srow, sdt, lg0);
      sc[m][1] = ldf(sp + g * srow, sdt, lg1);
      sc[m][2] = ldf(sp + (g + 8) * srow, sdt, lg0);
      sc[m][3] = ldf(sp + (g + 8) * srow, sdt, lg1);
      bi[m][0] = ldf(zp + g * srow, sdt, lg0);
      bi[m][1] = ldf(zp + g * srow, sdt, lg1);
      bi[m][2] = ldf(zp + (g + 8) * srow, sdt, lg0);
      bi[m][3] = ldf(zp + (g + 8) * srow, sdt, lg1);
    }
    const float s0 = in ? xsum[run] : 0.0f, s1 = in ? xsum[run + 1] : 0.0f;
    const float o0 = in ? xsum[runs + run] : 0.0f, o1 = in ? xsum[runs + run + 1] : 0.0f;
    float cc[NM][4];
#pragma unroll
    for (int m = 0; m < NM; m++) cc[m][0] = cc[m][1] = cc[m][2] = cc[m][3] = 0.0f;
#pragma unroll
    for (int u = 0; u < 2; u++) {
      if (u == 1 && !full) break;  // uniform across the warp
      const int slot = ((t + 4 * u) ^ ((g & 1) << 2)) << 4;
      uint4 q[NM][2];
#pragma unroll
      for (int m = 0; m < NM; m++) {
        q[m][0] = *(const uint4*)(st + m * mbytes + g * 128 + slot);
        q[m][1] = *(const uint4*)(st + m * mbytes + (g + 8) * 128 + slot);
      }
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const uint4 xb = u == mine ? xs[c * 32 + 4 * (t + 4 * u) + j] : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int m = 0; m < NM; m++)
          tc_mma_word<X>(cc[m], ((const unsigned*)&q[m][0])[j], ((const unsigned*)&q[m][1])[j], xb);
      }
    }
#pragma unroll
    for (int m = 0; m < NM; m++)
      if (in) tc_scale_runs<X>(acc[m], cc[m], sc[m], bi[m], s0, s1, o0, o1);
    c += warps;
    if (c >= chunks) {  // the tile's last chunk of this warp: the block sums and stores it
      float out[NM];
      tc_block_sum<NM>(acc, wpart, out);
      if (threadIdx.x < 16) {
        i64 row0;
        const int part = parts.locate(ctile, &row0);
        if (row0 + threadIdx.x < parts.n[part]) epi(part, row0 + threadIdx.x, out[0], out[NM - 1]);
      }
#pragma unroll
      for (int m = 0; m < NM; m++) acc[m][0] = acc[m][1] = 0.0f;
      __syncthreads();
      c = warp;
      ctile += gridDim.x;
    }
  }
}

// The ring variants of tc_qgemv, tc_qglu and tc_qgemv3: their parameter lists, then the stages a
// warp has (1 to 8).
#define TC_RING(XN, X)                                                                                                \
  extern "C" __global__ void tc_qgemv_##XN##_4_ring(const void* x, int, const unsigned* w, const void* s,             \
                                                   const void* z, int sdt, void* y, int ydt, i64 n, i64 k,            \
                                                   int group, int ring) {                                             \
    const QMat mats[3] = {{w, s, z}, {w, s, z}, {w, s, z}};                                                            \
    tc_qring<X, 1>(x, NormIn{}, mats, Parts{{n, 0, 0}}, sdt, k, group, ring,                                          \
                   [&](int, i64 r, float o, float) { stf(y, ydt, r, o); });                                            \
  }                                                                                                                   \
  extern "C" __global__ void tc_qglu_##XN##_4_ring(                                                                   \
      const void* x, int, const unsigned* wg, const void* sg, const void* zg, const unsigned* wu, const void* su,     \
      const void* zu, int sdt, void* y, int ydt, int gdt, int act, i64 n, i64 k, int group, NORM_IN_PARAMS,          \
      int ring) {                                                                                                     \
    const QMat mats[3] = {{wg, sg, zg}, {wu, su, zu}, {wu, su, zu}};                                                   \
    tc_qring<X, 2>(x, NORM_IN, mats, Parts{{n, 0, 0}}, sdt, k, group, ring,                                           \
                   [&](int, i64 r, float g, float u) { stf(y, ydt, r, glu_out(g, u, gdt, act)); });                    \
  }                                                                                                                   \
  extern "C" __global__ void tc_qgemv3_##XN##_4_ring(                                                                 \
      const void* x, const unsigned* w0, const void* s0, const void* z0, void* y0, i64 n0, const unsigned* w1,        \
      const void* s1, const void* z1, void* y1, i64 n1, const unsigned* w2, const void* s2, const void* z2,           \
      void* y2, i64 n2, int sdt, int ydt, i64 k, int group, NORM_IN_PARAMS, const void* b0, const void* b1,           \
      const void* b2, int ring) {                                                                                     \
    const QMat mats[3] = {{w0, s0, z0}, {w1, s1, z1}, {w2, s2, z2}};                                                  \
    tc_qring<X, 1>(x, NORM_IN, mats, Parts{{n0, n1, n2}}, sdt, k, group, ring, [&](int part, i64 r, float o, float) { \
      stf(part == 0 ? y0 : part == 1 ? y1 : y2, ydt, r, with_bias(o, part == 0 ? b0 : part == 1 ? b1 : b2, ydt, r));  \
    });                                                                                                               \
  }
TC_RING(f16, F16)
TC_RING(bf16, BF16)

// The routed-expert product at decode on the tensor cores: blockIdx.y the (token, slot) pair,
// blockIdx.x a 16-row tile of expert e (ids[p], or the router's choice for the pair);
// gather_qmm's parameter list (see gather_qgemv). NM stacked-expert weights (w[m], s[m], z[m]: a
// product, or a GLU's gate and up) applied to pair p = blockIdx.y's row of x for expert e:
// out[m] for row blockIdx.x · 16 + threadIdx.x (threads < 16), false where e is out of range
// (the error flag is then set).
template <class X, int NM>
__device__ __forceinline__ bool tc_gather_qdot(const void* x, i64 x_rows, const unsigned* const* w,
                                               const void* const* s, const void* const* z, int sdt, i64 e,
                                               i64 top, i64 experts, i64 n, i64 k, int group, int* error, int tag,
                                               float* out) {
  const i64 p = blockIdx.y;
  if (e < 0 || e >= experts) {  // the whole block leaves: e is the same for all its threads
    if (threadIdx.x == 0 && blockIdx.x == 0) atomicCAS(error, 0, tag);
    return false;
  }
  const i64 xr = (p / top) * x_rows + (x_rows == 1 ? 0 : p % top);
  const typename X::T* xrow = (const typename X::T*)x + xr * k;
  const i64 rows = e * n, groups = k / group, ssz = sdt == 0 ? 4 : 2;
  const unsigned* we[NM];
  const void *se[NM], *ze[NM];
#pragma unroll
  for (int m = 0; m < NM; m++) {
    we[m] = w[m] + rows * (k / 8);
    se[m] = (const char*)s[m] + rows * groups * ssz;
    ze[m] = (const char*)z[m] + rows * groups * ssz;
  }
  tc_qdot<X, NM>(xrow, NormIn{}, true, we, se, ze, sdt, (i64)blockIdx.x * 16, n, k, group, out);
  return true;
}

template <class X>
__device__ __forceinline__ void tc_gather_qgemv(const void* x, i64 x_rows, const unsigned* w, const void* s,
                                                const void* z, int sdt, const void* ids, int id_kind, void* y,
                                                int ydt, i64 top, i64 experts, i64 n, i64 k, int group, int* error,
                                                int tag) {
  float out[1];
  const i64 row = (i64)blockIdx.x * 16 + threadIdx.x;
  const i64 e = ld_index(ids, id_kind, blockIdx.y);
  if (tc_gather_qdot<X, 1>(x, x_rows, &w, &s, &z, sdt, e, top, experts, n, k, group, error, tag, out) &&
      threadIdx.x < 16 && row < n)
    stf(y, ydt, blockIdx.y * n + row, out[0]);
}
#define TC_GATHER(XN, X)                                                                                              \
  extern "C" __global__ void tc_gather_qgemv_##XN##_4(                                                                \
      const void* x, int, i64 x_rows, const unsigned* w, const void* s, const void* z, int sdt, const void* ids,      \
      int id_kind, void* y, int ydt, i64, i64 top, i64 experts, i64 n, i64 k, int, int group, int* error,             \
      int tag) {                                                                                                      \
    tc_gather_qgemv<X>(x, x_rows, w, s, z, sdt, ids, id_kind, y, ydt, top, experts, n, k, group, error, tag);         \
  }
TC_GATHER(f16, F16)
TC_GATHER(bf16, BF16)

// The expert of pair p = blockIdx.y (its token's choice p % top) made from the router's logits
// [tokens, e] (e <= 256, top <= 32) as moe_route makes it, so the routed GLU needs no launch
// between the router's product and the experts: warp 0 makes the token's probabilities
// (router_probs) and their sort keys, then each thread ranks its experts among all e. The keys
// are distinct, so a key's rank is its place in moe_route's selection order. The blocks of tile
// 0 write the pair's id and weight (router_weight) where moe_route would have, for the down
// product and the combine. Every thread of the block calls it.
__device__ __forceinline__ i64 route_pair(const void* logits, int dt, i64 e, i64 top, int high, int renorm,
                                          unsigned* ids, void* weights) {
  __shared__ unsigned long long keys[256];
  __shared__ int chosen[32];
  const i64 p = blockIdx.y;
  const int r = (int)(p % top), lane = threadIdx.x & 31;
  if (threadIdx.x < 32) {
    float v[8];
    router_probs(logits, dt, p / top, e, lane, v);
#pragma unroll
    for (int t = 0; t < 8; t++)
      if (lane + 32 * t < e) keys[lane + 32 * t] = order_key(v[t], lane + 32 * t, high);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < e; i += blockDim.x) {
    const unsigned long long key = keys[i];
    int rank = 0;
#pragma unroll 8
    for (int j = 0; j < e; j++) rank += keys[j] > key;
    if (rank < top) chosen[rank] = i;
  }
  __syncthreads();
  const int id = chosen[r];
  if (blockIdx.x == 0 && threadIdx.x < 32) {
    const float w = router_weight(lane < top ? key_value(keys[chosen[lane]]) : 0.0f, dt, renorm);
    if (lane == r) {
      ids[p] = (unsigned)id;
      stf(weights, dt, p, w);
    }
  }
  return id;
}

// The routed experts' gate and up with the activation and product (a MoE's gated MLP at decode)
// in one launch: gather_qgemv's grid; y [pairs, n] = act(x·Gₑᵀ) · (x·Uₑᵀ) as tc_qglu stores it,
// e = ids[p] (tc_gather_qglu) or the router's choice made from its logits (tc_gather_qglu_route,
// which writes the ids and the router weights: route_pair).
template <class X>
__device__ __forceinline__ void tc_gather_glu(const void* x, i64 x_rows, const unsigned* wg, const void* sg,
                                              const void* zg, const unsigned* wu, const void* su, const void* zu,
                                              int sdt, i64 e, void* y, int ydt, int gdt, int act, i64 top,
                                              i64 experts, i64 n, i64 k, int group, int* error, int tag) {
  const unsigned* ws[2] = {wg, wu};
  const void* ss[2] = {sg, su};
  const void* zs[2] = {zg, zu};
  float out[2];
  const i64 row = (i64)blockIdx.x * 16 + threadIdx.x;
  if (tc_gather_qdot<X, 2>(x, x_rows, ws, ss, zs, sdt, e, top, experts, n, k, group, error, tag, out) &&
      threadIdx.x < 16 && row < n)
    stf(y, ydt, blockIdx.y * n + row, glu_out(out[0], out[1], gdt, act));
}
#define TC_GATHER_GLU(XN, X)                                                                                          \
  extern "C" __global__ void tc_gather_qglu_##XN##_4(                                                                 \
      const void* x, i64 x_rows, const unsigned* wg, const void* sg, const void* zg, const unsigned* wu,              \
      const void* su, const void* zu, int sdt, const void* ids, int id_kind, void* y, int ydt, int gdt, int act,      \
      i64 top, i64 experts, i64 n, i64 k, int group, int* error, int tag) {                                           \
    tc_gather_glu<X>(x, x_rows, wg, sg, zg, wu, su, zu, sdt, ld_index(ids, id_kind, blockIdx.y), y, ydt, gdt, act,  \
                     top, experts, n, k, group, error, tag);                                                          \
  }                                                                                                                   \
  extern "C" __global__ void tc_gather_qglu_route_##XN##_4(                                                           \
      const void* x, i64 x_rows, const unsigned* wg, const void* sg, const void* zg, const unsigned* wu,              \
      const void* su, const void* zu, int sdt, unsigned* ids, void* y, int ydt, int gdt, int act, i64 top,            \
      i64 experts, i64 n, i64 k, int group, int* error, int tag, const void* logits, int ldt, i64 e, int high,        \
      int renorm, void* weights) {                                                                                    \
    const i64 id = route_pair(logits, ldt, e, top, high, renorm, ids, weights);                                       \
    tc_gather_glu<X>(x, x_rows, wg, sg, zg, wu, su, zu, sdt, id, y, ydt, gdt, act, top, experts, n, k, group, error, \
                     tag);                                                                                            \
  }
TC_GATHER_GLU(f16, F16)
TC_GATHER_GLU(bf16, BF16)

// ---- A few rows of x by 4-bit weights on the tensor cores (a batched decode step) -----------
// y [rows, n] = x [rows, k] · dequant(w)ᵀ for 2 to 64 rows of f16/bf16 x in NT tiles of 8 rows,
// n a multiple of 16, k of 128, groups multiples of 32 dividing k: each weight is read once for
// all the rows. Block (128 weight rows, split of k) of 4 warps; warp w takes rows 32w .. 32w + 31
// as two 16-row tiles over its split's chunks of 128 values. Lane (g, t) loads run t (16 bytes)
// of rows g and g + 8 of each tile and makes each nibble pair (e, e + 4) two values of x's
// dtype: the exact off + q of one LOP3, less off, then q · scale + bias rounded once (as the
// cuBLAS path expands a weight). They are the A operand of mma.m16n8k16 (f32 accumulation);
// x, staged a chunk at a time in shared memory with each 8 values in the pairs' order
// (0,4,1,5,2,6,3,7), is B, 8 rows of x a tile. The next chunk's weights, scales and x are
// requested before this chunk's products (x into the other of two buffers: one barrier a
// chunk, and no wait on x's load at each). With several splits (gridDim.y) each writes f32 partials
// part [split, rows, n], which qmm_rows_sum adds in split order.
#define QR_ROWS 128   // weight rows a block
#define QR_STRIDE 20  // uint4 a staged row of x: 16, and 4 of padding (conflict-free fragment loads)

template <class X> struct Pair;
template <> struct Pair<F16> {
  static __device__ __forceinline__ unsigned fma(unsigned a, unsigned b, unsigned c) {
    unsigned d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
  }
};
template <> struct Pair<BF16> {
  static __device__ __forceinline__ unsigned fma(unsigned a, unsigned b, unsigned c) {
    unsigned d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
  }
};
// v rounded to X, in both halves of a register.
template <class X> __device__ __forceinline__ unsigned pair_of(float v) {
  typename X::T h[1];
  X::st(h, 0, v);
  return (unsigned)h[0] * 0x10001u;
}
// The A fragments of one 32-bit word of rows g and g + 8 (wa, wb: 8 nibbles each) for mma:
// a[h] holds the nibble pairs (0,4)/(1,5) (h = 0) or (2,6)/(3,7) (h = 1), each value made
// the exact off + q of one LOP3, less off, then q · scale + bias rounded once to X (sc, bi:
// each row's scale and bias in both halves).
template <class X>
__device__ __forceinline__ void qmm_a_fragments(unsigned wa, unsigned wb, const unsigned* sc, const unsigned* bi,
                                                unsigned (*a)[4]) {
  typedef TensorCore<X> TC;
  typedef Pair<X> P;
  const unsigned one = pair_of<X>(1.0f), less = pair_of<X>(-TC::OFF);
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int sh = 8 * h;
    a[h][0] = P::fma(P::fma(tc_nibbles<X, false>(wa >> sh), one, less), sc[0], bi[0]);
    a[h][1] = P::fma(P::fma(tc_nibbles<X, false>(wb >> sh), one, less), sc[1], bi[1]);
    a[h][2] = P::fma(P::fma(tc_nibbles<X, false>(wa >> (sh + 4)), one, less), sc[0], bi[0]);
    a[h][3] = P::fma(P::fma(tc_nibbles<X, false>(wb >> (sh + 4)), one, less), sc[1], bi[1]);
  }
}
//
// The rows may be gathered: local row r of x is row xrow[r] of x and goes to row yrow[r] of y
// (null: r itself), and the weight's rows start at row w0 (an expert's slice of stacked
// weights; grouped_rows in grouped.cu). Chunks c0 .. c1 - 1 of k are this block's; with partials
// they go to split `split` of part. Tiles of x wholly past `rows` are skipped.
template <class X, int NT, bool AHEAD>
__device__ __forceinline__ void qmm_rows(const void* x, const unsigned* w, const void* s, const void* z, int sdt,
                                         void* y, int ydt, float* part, i64 rows, i64 n, i64 k, int group,
                                         i64 c0, i64 c1, i64 split, const int* xrow, const int* yrow, i64 w0) {
  typedef TensorCore<X> TC;
  __shared__ uint4 xs[2][8 * NT * QR_STRIDE];  // two chunks of x, each [row][word j][run t]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const i64 wrow = k / 8, groups = k / group;
  const int glog = group == 32 ? 5 : group == 64 ? 6 : 7;  // groups are 32, 64 or 128 values
  i64 base[2], ra[2], rb[2];
  bool live[2];
#pragma unroll
  for (int m = 0; m < 2; m++) {
    base[m] = (i64)blockIdx.x * QR_ROWS + warp * 32 + m * 16;
    live[m] = base[m] < n;  // n is a multiple of 16: a tile is all in or all out
    ra[m] = w0 + (live[m] ? base[m] + g : 0);
    rb[m] = w0 + (live[m] ? base[m] + g + 8 : 0);
  }
  uint4 q[2][2];          // [tile][row g, g + 8]: run t of the chunk
  unsigned sb[2][2][2];   // [tile][row][scale, bias] bits
  auto fetch = [&](i64 c) {
    const i64 gi = (c * 128 + 32 * t) >> glog;
#pragma unroll
    for (int m = 0; m < 2; m++) {
      q[m][0] = __ldcs((const uint4*)(w + ra[m] * wrow) + c * 4 + t);
      q[m][1] = __ldcs((const uint4*)(w + rb[m] * wrow) + c * 4 + t);
      sb[m][0][0] = ld_bits(s, sdt, ra[m] * groups + gi);
      sb[m][0][1] = ld_bits(z, sdt, ra[m] * groups + gi);
      sb[m][1][0] = ld_bits(s, sdt, rb[m] * groups + gi);
      sb[m][1][1] = ld_bits(z, sdt, rb[m] * groups + gi);
    }
  };
  // x a chunk at a time: NT 8-value words a thread (8 · NT rows of 16), loaded into registers a
  // chunk ahead and stored reordered into the buffer the next chunk reads.
  uint4 xr[NT];
  auto xload = [&](i64 c) {
#pragma unroll
    for (int e = 0; e < NT; e++) {
      const int i = threadIdx.x + 128 * e, r = i >> 4, u = i & 15;  // row, word u = 4 · run + j
      xr[e] = r < rows ? ((const uint4*)x)[(xrow ? xrow[r] : r) * wrow + c * 16 + u] : make_uint4(0, 0, 0, 0);
    }
  };
  auto xstore = [&](uint4* buf) {
#pragma unroll
    for (int e = 0; e < NT; e++) {
      const int i = threadIdx.x + 128 * e, r = i >> 4, u = i & 15;
      const uint4 v = xr[e];
      buf[r * QR_STRIDE + (u & 3) * 4 + (u >> 2)] = pairs_order(v);
    }
  };
  float acc[2][NT][4];
#pragma unroll
  for (int m = 0; m < 2; m++)
#pragma unroll
    for (int i = 0; i < NT; i++) acc[m][i][0] = acc[m][i][1] = acc[m][i][2] = acc[m][i][3] = 0.0f;
  if (c0 < c1) {
    fetch(c0);
    xload(c0);
    xstore(xs[0]);
  }
  __syncthreads();
  for (i64 c = c0; c < c1; c++) {
    if (!AHEAD && c > c0) {  // x staged here, its load waited on (for comparison)
      xload(c);
      xstore(xs[0]);
      __syncthreads();
    }
    const uint4* xb = xs[AHEAD ? (c - c0) & 1 : 0];
    uint4 cur[2][2];
    unsigned sc[2][2], bi[2][2];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
      for (int r = 0; r < 2; r++) {
        cur[m][r] = q[m][r];
        sc[m][r] = pair_of<X>(bits_float(sb[m][r][0], sdt));
        bi[m][r] = pair_of<X>(bits_float(sb[m][r][1], sdt));
      }
    const bool more = c + 1 < c1;
    if (more) {
      fetch(c + 1);
      if (AHEAD) xload(c + 1);
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
      // A: tile m, nibble pairs (0,4)/(1,5) (h = 0) or (2,6)/(3,7) (h = 1) of word j.
      unsigned a[2][2][4];
#pragma unroll
      for (int m = 0; m < 2; m++) {
        const unsigned wa = ((const unsigned*)&cur[m][0])[j], wb = ((const unsigned*)&cur[m][1])[j];
        qmm_a_fragments<X>(wa, wb, sc[m], bi[m], a[m]);
      }
#pragma unroll
      for (int i = 0; i < NT; i++) {
        if (i * 8 >= rows) break;  // the same in every lane
        const uint4 b = xb[(i * 8 + g) * QR_STRIDE + j * 4 + t];
#pragma unroll
        for (int m = 0; m < 2; m++) {
          TC::mma(acc[m][i], a[m][0], b.x, b.y);
          TC::mma(acc[m][i], a[m][1], b.z, b.w);
        }
      }
    }
    // The other buffer was last read before the previous barrier.
    if (more && AHEAD) xstore(xs[(c + 1 - c0) & 1]);
    __syncthreads();
  }
  // Lane (g, t) holds rows g and g + 8 of each tile for rows 2t and 2t + 1 of each x tile.
#pragma unroll
  for (int m = 0; m < 2; m++) {
    if (!live[m]) continue;
#pragma unroll
    for (int i = 0; i < NT; i++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const i64 xr = i * 8 + 2 * t + (e & 1), wr = base[m] + g + 8 * (e >> 1);
        if (xr >= rows) continue;
        const i64 yr = yrow ? yrow[xr] : xr;
        if (part) part[(split * rows + yr) * n + wr] = acc[m][i][e];
        else stf(y, ydt, yr * n + wr, acc[m][i][e]);
      }
    }
  }
}
// qmm_rows_{x}_{NT}, and qmm_rows_{x}_{NT}_s, which stages x only when it reaches each chunk
// (MLXCEL_QMM_AHEAD=0, for comparison).
#define QMM_ROWS(XN, X, NT)                                                                                          \
  extern "C" __global__ void __launch_bounds__(128) qmm_rows_##XN##_##NT(                                            \
      const void* x, const unsigned* w, const void* s, const void* z, int sdt, void* y, int ydt, float* part,         \
      i64 rows, i64 n, i64 k, int group, i64 per_split) {                                                             \
    const i64 c0 = blockIdx.y * per_split, c1 = c0 + per_split < k / 128 ? c0 + per_split : k / 128;                  \
    qmm_rows<X, NT, true>(x, w, s, z, sdt, y, ydt, part, rows, n, k, group, c0, c1, blockIdx.y, nullptr, nullptr, 0);  \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(128) qmm_rows_##XN##_##NT##_s(                                        \
      const void* x, const unsigned* w, const void* s, const void* z, int sdt, void* y, int ydt, float* part,         \
      i64 rows, i64 n, i64 k, int group, i64 per_split) {                                                             \
    const i64 c0 = blockIdx.y * per_split, c1 = c0 + per_split < k / 128 ? c0 + per_split : k / 128;                  \
    qmm_rows<X, NT, false>(x, w, s, z, sdt, y, ydt, part, rows, n, k, group, c0, c1, blockIdx.y, nullptr, nullptr, 0); \
  }
QMM_ROWS(f16, F16, 1)
QMM_ROWS(f16, F16, 2)
QMM_ROWS(f16, F16, 4)
QMM_ROWS(f16, F16, 8)
QMM_ROWS(bf16, BF16, 1)
QMM_ROWS(bf16, BF16, 2)
QMM_ROWS(bf16, BF16, 4)
QMM_ROWS(bf16, BF16, 8)

// ---- qmm_rows with each warp's weights streamed through shared memory ---------------------------
// The same blocks, lanes and math as qmm_rows (so the same outputs, bit for bit), for scales and
// biases in x's dtype and groups of 32 or 64: cp.async keeps the next S - 1 chunks of each warp's
// weights, scales and biases in flight in a shared-memory ring, where qmm_rows holds one chunk
// in registers (254 of them, two blocks an SM, one chunk a warp in flight). NT is the exact
// count of 8-row tiles of x (the last zero-padded), so the loop tests no tile, and offsets are
// 32-bit. A warp's stage: its 32 weight rows' 4 words of the chunk (row r at r · 64 bytes: a
// quarter warp reads rows g and g + 1 whole, no bank conflict), then the rows' scales, then their
// biases, spr = 128 / group values a row each (4-byte copies: a row's values of a chunk start on
// 4 bytes since k / group is even).
#define QR_RING_STAGES 3

template <int N> __device__ __forceinline__ void cp_async_wait_n() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// One weight's products, or with GLU a GLU's gate and up; rblock is the block's row block of its
// weight. A product's value v (not GLU) of row xi of x and weight row wr goes to
// store(xi, wr, v), the kernel's epilogue.
template <class X, int NT, int S, bool GLU, class Store>
__device__ __forceinline__ void qmm_ring(const void* x, const unsigned* w0, const void* s0, const void* z0,
                                         const unsigned* w1, const void* s1, const void* z1, void* y, int ydt, int gdt,
                                         int act, float* part, int rows, int n, int k, int group, int rblock, int c0,
                                         int c1, int split, Store store) {
  typedef TensorCore<X> TC;
  extern __shared__ uint4 qring[];
  uint4* xs = qring;                        // this chunk of x: [row][word j][run t]
  uint4* xn = xs + 8 * NT * QR_STRIDE;      // the next chunk of x as it lands: [row][word]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int hs = group == 32 ? 1 : 0, half = 1 << hs, spr = 2 * half;  // a row's scale words, values a chunk
  const int sbytes = 64 * spr, stage = 2048 + 2 * sbytes;
  unsigned char* ring = (unsigned char*)(xn + 8 * NT * 16) + warp * S * stage;
  // The warp's weight rows: 32 of w0 from row0 (tile m at row0 + 16m); with GLU, 16 of w0 (tile
  // 0, the gate) and the same 16 of w1 (tile 1, the up), so a lane holds both of its outputs.
  const int row0 = rblock * (GLU ? 64 : QR_ROWS) + warp * (GLU ? 16 : 32);
  const bool live0 = row0 < n, live1 = GLU ? live0 : row0 + 16 < n;  // n a multiple of 16: tiles all in or out
  const int wrow = k / 32, srow = (k >> (6 - hs)) / 2;  // a row's uint4 of weights, 4-byte words of scales
  // Stage row r (tile r / 16) comes from this row of its weight:
  auto src_row = [&](int r) { return row0 + (GLU ? r & 15 : r); };
  // A GLU's six weight pointers, read from shared memory at each copy (kept in registers across
  // the loop, they made the 64-row kernel spill).
  __shared__ const void* mats[6];
  if (GLU && threadIdx.x < 6) {
    const void* p[6] = {w0, s0, z0, w1, s1, z1};
#pragma unroll
    for (int i = 0; i < 6; i++)
      if (threadIdx.x == i) mats[i] = p[i];
  }
  if (GLU) __syncthreads();
  // The copies of a chunk: lane takes word t of rows g + 8i (i < 4) and the scale and bias words
  // lane + 32q (q < half) of the stage, row (lane + 32q) / half. A dead tile's rows are not
  // copied (its products are never stored).
  const int sbase = src_row(lane >> hs) * srow + (lane & hs);  // the scale words' offset for q = 0
  auto issue = [&](int c, int slot) {  // c past the split: an empty group, so the waits stay uniform
    if (c < c1) {
      unsigned char* st = ring + slot * stage;
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int r = g + 8 * i;
        if (i < 2 ? live0 : live1)
          cp_async16(st + r * 64 + t * 16, (const uint4*)(GLU ? mats[i >= 2 ? 3 : 0] : w0) + src_row(r) * wrow + c * 4 + t);
      }
#pragma unroll
      for (int q = 0; q < 2; q++) {
        if (q >= half) break;
        // Row r's offset: q = 1 (groups of 32 only) is 16 rows on, or with GLU the same row of up.
        const int e = lane + 32 * q, r = e >> hs, so = sbase + (GLU ? 0 : q * 16 * srow) + c * half;
        if (r < 16 ? live0 : live1) {
          const int second = r >= 16 ? 3 : 0;
          cp_async4(st + 2048 + 4 * e, (const unsigned*)(GLU ? mats[1 + second] : s0) + so);
          cp_async4(st + 2048 + sbytes + 4 * e, (const unsigned*)(GLU ? mats[2 + second] : z0) + so);
        }
      }
    }
    cp_async_commit();
  };
  // x a chunk at a time: copied as it is into xn a chunk ahead (thread row r = tid / 16 + 8e,
  // word u = tid % 16; rows past `rows` stay zero), then reordered into xs as qmm_rows stages it.
  const int xr0 = threadIdx.x >> 4, xu = threadIdx.x & 15, xrow = k / 8;
  auto xcopy = [&](int c) {
    if (c < c1) {
#pragma unroll
      for (int e = 0; e < NT; e++) {
        const int r = xr0 + 8 * e;
        if (r < rows) cp_async16(&xn[r * 16 + xu], (const uint4*)x + r * xrow + c * 16 + xu);
      }
    }
    cp_async_commit();
  };
  auto xorder = [&]() {
#pragma unroll
    for (int e = 0; e < NT; e++) {
      const int r = xr0 + 8 * e;
      xs[r * QR_STRIDE + (xu & 3) * 4 + (xu >> 2)] = pairs_order(xn[r * 16 + xu]);
    }
  };
#pragma unroll
  for (int e = 0; e < NT; e++)
    if (xr0 + 8 * e >= rows) xn[(xr0 + 8 * e) * 16 + xu] = make_uint4(0, 0, 0, 0);
  float acc[2][NT][4];
#pragma unroll
  for (int m = 0; m < 2; m++)
#pragma unroll
    for (int i = 0; i < NT; i++) acc[m][i][0] = acc[m][i][1] = acc[m][i][2] = acc[m][i][3] = 0.0f;
  const int gi = t >> (1 - hs);  // this lane's group in a chunk (run t)
  // Copy groups in order: weights of chunks c0 .. c0 + S - 3, x of c0, weights of c0 + S - 2; then
  // each chunk c adds x of c + 1 and weights of c + S - 1. So at chunk c's top, all but the
  // newest group done means its x and weights are in.
#pragma unroll
  for (int f = 0; f < S - 2; f++) issue(c0 + f, f);
  xcopy(c0);
  issue(c0 + S - 2, S - 2);
  for (int c = c0; c < c1; c++) {
    const int slot = (c - c0) % S;
    cp_async_wait_n<1>();
    __syncthreads();  // chunk c's x and weights are in for every thread; xs and slot c - 1 are free
    xorder();
    __syncthreads();  // xs holds chunk c; xn is free
    const unsigned char* st = ring + slot * stage;
    const unsigned* cur = (const unsigned*)(st + g * 64 + t * 16);  // word j of row g + 8r of tile m: [64m + 32r + j]
    unsigned sc[2][2], bi[2][2];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
      for (int r = 0; r < 2; r++) {
        const int row = m * 16 + g + 8 * r;
        sc[m][r] = 0x10001u * *(const unsigned short*)(st + 2048 + row * spr * 2 + gi * 2);
        bi[m][r] = 0x10001u * *(const unsigned short*)(st + 2048 + sbytes + row * spr * 2 + gi * 2);
      }
    xcopy(c + 1);
    issue(c + S - 1, (c - c0 + S - 1) % S);
#pragma unroll 2
    for (int j = 0; j < 4; j++) {
      unsigned a[2][2][4];
#pragma unroll
      for (int m = 0; m < 2; m++) {
        const unsigned wa = cur[256 * m + j], wb = cur[256 * m + 128 + j];  // rows g, g + 8 of tile m
        qmm_a_fragments<X>(wa, wb, sc[m], bi[m], a[m]);
      }
#pragma unroll
      for (int i = 0; i < NT; i++) {
        const uint4 b = xs[(i * 8 + g) * QR_STRIDE + j * 4 + t];
#pragma unroll
        for (int m = 0; m < 2; m++) {
          TC::mma(acc[m][i], a[m][0], b.x, b.y);
          TC::mma(acc[m][i], a[m][1], b.z, b.w);
        }
      }
    }
  }
  cp_async_wait_n<0>();  // no copy outlives the block
  // Lane (g, t) holds rows g and g + 8 of each tile for rows 2t and 2t + 1 of each x tile. With
  // GLU: act(gate) · up, or both partials, gate then up, of each row of y ([split, rows, 2, n]).
  if (GLU) {
    if (!live0) return;
#pragma unroll
    for (int i = 0; i < NT; i++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int xi = i * 8 + 2 * t + (e & 1), wr = row0 + g + 8 * (e >> 1);
        if (xi >= rows) continue;
        if (part) {
          float* pr = part + ((i64)split * rows + xi) * 2 * n + wr;
          pr[0] = acc[0][i][e];
          pr[n] = acc[1][i][e];
        } else {
          stf(y, ydt, (i64)xi * n + wr, glu_out(acc[0][i][e], acc[1][i][e], gdt, act));
        }
      }
    }
    return;
  }
#pragma unroll
  for (int m = 0; m < 2; m++) {
    if (!(m ? live1 : live0)) continue;
#pragma unroll
    for (int i = 0; i < NT; i++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int xi = i * 8 + 2 * t + (e & 1), wr = row0 + m * 16 + g + 8 * (e >> 1);
        if (xi >= rows) continue;
        store(xi, wr, acc[m][i][e]);
      }
    }
  }
}
// qmm_ring_{x}_{NT}: qmm_rows_{x}_{NT}'s parameters (sdt must be x's dtype code, group 32 or
// 64); dynamic shared memory: 8 · NT · (QR_STRIDE + 16) · 16 bytes of x, then 4 warps x
// QR_RING_STAGES stages of 2048 + 256 · 128 / group bytes. NT is 1, 2, 4 or 8 (a batched step's
// rows are a power of two; other counts take the next NT, their last tiles zeros).
// qmm_ring_glu_{x}_{NT}: y [rows, n] = act(x·Gᵀ) · (x·Uᵀ) as glu_out makes it (gdt, act as
// there), blocks of 64 rows of both weights; with several splits, partials [split, rows, 2, n]
// that qmm_rows_sum_glu finishes. qmm_ring3_{x}_{NT}: up to three products of one x (a batched
// step's q, k and v), each its own blocks of 128 rows, in one launch (see QMM_RING3).
// Blocks an SM qmm_ring_glu is compiled for (1, 2 and 4 tiles of x only: at 8 it fit two
// blocks an SM, three spilled, and two qmm_ring launches were faster).
#define QR_GLU_BLOCKS(NT) 3
// A split's chunks [c0, c1) of k (per_split each).
#define QR_SPLIT                                                                                                      \
  const int chunks = (int)(k / 128), c0 = (int)(blockIdx.y * per_split);                                              \
  const int c1 = c0 + (int)per_split < chunks ? c0 + (int)per_split : chunks;
#define QMM_RING(XN, X, NT)                                                                                           \
  extern "C" __global__ void __launch_bounds__(128, 3) qmm_ring_##XN##_##NT(                                          \
      const void* x, const unsigned* w, const void* s, const void* z, int sdt, void* y, int ydt, float* part,         \
      i64 rows, i64 n, i64 k, int group, i64 per_split) {                                                             \
    QR_SPLIT                                                                                                          \
    auto store = [&](int xi, int wr, float v) {                                                                       \
      if (part) part[((i64)blockIdx.y * rows + xi) * n + wr] = v;                                                     \
      else stf(y, ydt, (i64)xi * n + wr, v);                                                                          \
    };                                                                                                                \
    qmm_ring<X, NT, QR_RING_STAGES, false>(x, w, s, z, w, s, z, y, ydt, 0, 0, part, (int)rows, (int)n, (int)k,        \
                                           group, blockIdx.x, c0, c1, blockIdx.y, store);                            \
  }                                                                                                                   \
  QMM_RING3(XN, X, NT)
#define QMM_RING_GLU(XN, X, NT)                                                                                       \
  extern "C" __global__ void __launch_bounds__(128, QR_GLU_BLOCKS(NT)) qmm_ring_glu_##XN##_##NT(                      \
      const void* x, const unsigned* wg, const void* sg, const void* zg, const unsigned* wu, const void* su,          \
      const void* zu, int sdt, void* y, int ydt, int gdt, int act, float* part, i64 rows, i64 n, i64 k, int group,    \
      i64 per_split) {                                                                                                \
    QR_SPLIT                                                                                                          \
    qmm_ring<X, NT, QR_RING_STAGES, true>(x, wg, sg, zg, wu, su, zu, y, ydt, gdt, act, part, (int)rows, (int)n,       \
                                          (int)k, group, blockIdx.x, c0, c1, blockIdx.y, [](int, int, float) {});   \
  }
// The products of a qmm_ring3 launch: block b is row block b of product 0, then of 1, then of 2
// (each n a multiple of 16, blocks of 128 rows). Without splits each writes y_p [rows, n_p]
// (plus its bias b_p where not null, as with_bias adds it); with them, partials [split, rows,
// n0 + n1 + n2] (product p's columns after those of the products before it) that
// qmm_rows_sum3 finishes. The block's weight pointers are chosen from the parameters by
// blockIdx (uniform registers); what the stores need waits in shared memory (held in registers
// through the loop, it and a pointer table made the 8-tile kernel spill).
#define QMM_RING3(XN, X, NT)                                                                                          \
  extern "C" __global__ void __launch_bounds__(128, 3) qmm_ring3_##XN##_##NT(                                         \
      const void* x, const unsigned* w0, const void* s0, const void* z0, void* y0, i64 n0, const unsigned* w1,        \
      const void* s1, const void* z1, void* y1, i64 n1, const unsigned* w2, const void* s2, const void* z2,           \
      void* y2, i64 n2, int sdt, int ydt, const void* b0, const void* b1, const void* b2, float* part, i64 rows,      \
      i64 k, int group, i64 per_split) {                                                                              \
    QR_SPLIT                                                                                                          \
    const int bl0 = (int)((n0 + QR_ROWS - 1) / QR_ROWS), bl1 = (int)((n1 + QR_ROWS - 1) / QR_ROWS);                    \
    const int p = blockIdx.x < bl0 ? 0 : blockIdx.x < bl0 + bl1 ? 1 : 2;                                              \
    const int rb = blockIdx.x - (p > 0 ? bl0 : 0) - (p > 1 ? bl1 : 0);                                                \
    const i64 n = p == 0 ? n0 : p == 1 ? n1 : n2;                                                                     \
    __shared__ void* out_y;                                                                                           \
    __shared__ const void* out_b;                                                                                     \
    __shared__ int out_n, out_col;                                                                                    \
    if (threadIdx.x == 0) { /* read after the loop's barriers (every split has a chunk) */                            \
      out_y = p == 0 ? y0 : p == 1 ? y1 : y2;                                                                         \
      out_b = p == 0 ? b0 : p == 1 ? b1 : b2;                                                                         \
      out_n = (int)n;                                                                                                 \
      out_col = (int)((p > 0 ? n0 : 0) + (p > 1 ? n1 : 0));                                                           \
    }                                                                                                                 \
    auto store = [&](int xi, int wr, float v) {                                                                       \
      if (part) part[((i64)blockIdx.y * rows + xi) * (n0 + n1 + n2) + out_col + wr] = v;                              \
      else stf(out_y, ydt, (i64)xi * out_n + wr, with_bias(v, out_b, ydt, wr));                                       \
    };                                                                                                                \
    const unsigned* w = p == 0 ? w0 : p == 1 ? w1 : w2;                                                               \
    const void* s = p == 0 ? s0 : p == 1 ? s1 : s2;                                                                   \
    const void* z = p == 0 ? z0 : p == 1 ? z1 : z2;                                                                   \
    qmm_ring<X, NT, QR_RING_STAGES, false>(x, w, s, z, w, s, z, nullptr, ydt, 0, 0, part, (int)rows, (int)n, (int)k,  \
                                           group, rb, c0, c1, blockIdx.y, store);                                    \
  }
#define QMM_RING_X(XN, X)                                                                                             \
  QMM_RING(XN, X, 1)                                                                                                  \
  QMM_RING(XN, X, 2)                                                                                                  \
  QMM_RING(XN, X, 4)                                                                                                  \
  QMM_RING(XN, X, 8)                                                                                                  \
  QMM_RING_GLU(XN, X, 1)                                                                                              \
  QMM_RING_GLU(XN, X, 2)                                                                                              \
  QMM_RING_GLU(XN, X, 4)
QMM_RING_X(f16, F16)
QMM_RING_X(bf16, BF16)

// qmm_ring3's outputs from its split partials part [splits, rows, n0 + n1 + n2], each summed in
// split order, with product p's bias b_p (null: none) as with_bias adds it.
extern "C" __global__ void qmm_rows_sum3(const float* part, i64 splits, i64 rows, void* y0, i64 n0, void* y1, i64 n1,
                                         void* y2, i64 n2, int ydt, const void* b0, const void* b1, const void* b2) {
  const i64 total = n0 + n1 + n2;
  for (i64 i = gid(); i < rows * total; i += gstride()) {
    const i64 r = i / total, c = i % total;
    float v = 0.0f;
    for (i64 sp = 0; sp < splits; sp++) v += part[(sp * rows + r) * total + c];
    if (c < n0) stf(y0, ydt, r * n0 + c, with_bias(v, b0, ydt, c));
    else if (c < n0 + n1) stf(y1, ydt, r * n1 + c - n0, with_bias(v, b1, ydt, c - n0));
    else stf(y2, ydt, r * n2 + c - n0 - n1, with_bias(v, b2, ydt, c - n0 - n1));
  }
}

// y [rows, n] (dtype ydt) = act(gate) · up from qmm_ring_glu's split partials [splits, rows, 2,
// n], each summed in split order (see glu_out).
extern "C" __global__ void qmm_rows_sum_glu(const float* part, i64 splits, i64 rows, i64 n, void* y, int ydt, int gdt,
                                            int act) {
  for (i64 i = gid(); i < rows * n; i += gstride()) {
    const i64 r = i / n, c = i % n;
    float gs = 0.0f, us = 0.0f;
    for (i64 sp = 0; sp < splits; sp++) {
      const float* p = part + ((sp * rows + r) * 2) * n + c;
      gs += p[0];
      us += p[n];
    }
    stf(y, ydt, i, glu_out(gs, us, gdt, act));
  }
}

// y [count] (dtype ydt) = the sum of qmm_rows's split partials part [splits, count], in order.
extern "C" __global__ void qmm_rows_sum(const float* part, i64 splits, i64 count, void* y, int ydt) {
  for (i64 i = gid(); i < count; i += gstride()) {
    float v = 0.0f;
    for (i64 sp = 0; sp < splits; sp++) v += part[sp * count + i];
    stf(y, ydt, i, v);
  }
}
