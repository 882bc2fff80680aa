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

// Rounds v to dtype code dt (as a store and reload would).
__device__ __forceinline__ float round_to(float v, int dt) {
  if (dt == 0) return v;
  unsigned short h;
  if (dt == 1) { F16::st(&h, 0, v); return F16::ld(&h, 0); }
  BF16::st(&h, 0, v);
  return BF16::ld(&h, 0);
}

// acc[r] += x[r, :] · dequant(w[col, :]) for r < m. BITS 4 or 8, group a multiple of 32.
template <class X, int BITS, int MR>
__device__ __forceinline__ void qdot_rows(const typename X::T* __restrict__ x, int m, i64 k,
                                          const unsigned* __restrict__ w, const void* s, const void* z, int sdt,
                                          i64 col, int group, float* acc) {
  constexpr int VALS = 128 / BITS, PER = 32 / BITS;
  constexpr unsigned MASK = (1u << BITS) - 1u;
  const int lane = threadIdx.x & 31;
  const i64 vecs = k / VALS, groups = k / group;
  const uint4* wr = (const uint4*)(w + col * (k / PER));
  for (i64 v0 = 0; v0 < vecs; v0 += 128) {
    uint4 q[4];
    float sc[4], bi[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const i64 v = v0 + u * 32 + lane;
      if (v < vecs) {
        q[u] = wr[v];
        const i64 g = col * groups + v * VALS / group;
        sc[u] = ldf(s, sdt, g);
        bi[u] = ldf(z, sdt, g);
      }
    }
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const i64 v = v0 + u * 32 + lane;
      if (v >= vecs) break;
      const unsigned words[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
#pragma unroll
      for (int r = 0; r < MR; r++) {
        if (r >= m) break;
        float xv[VALS];
#pragma unroll
        for (int c = 0; c < VALS / 8; c++) ldx8<X>(x + r * k + v * VALS + 8 * c, xv + 8 * c);
        float dq = 0.0f, dx = 0.0f;
#pragma unroll
        for (int wi = 0; wi < 4; wi++) {
#pragma unroll
          for (int e = 0; e < PER; e++) {
            const float xe = xv[wi * PER + e];
            dq = fmaf(xe, (float)((words[wi] >> (e * BITS)) & MASK), dq);
            dx += xe;
          }
        }
        acc[r] = fmaf(sc[u], dq, fmaf(bi[u], dx, acc[r]));
      }
    }
  }
}

// acc[r] += x[r, :] · w[col, :] for a 16-bit weight type W.
template <class X, class W, int MR>
__device__ __forceinline__ void ddot_rows(const typename X::T* __restrict__ x, int m, i64 k,
                                          const unsigned short* __restrict__ w, i64 col, float* acc) {
  const int lane = threadIdx.x & 31;
  const i64 vecs = k / 8;
  const uint4* wr = (const uint4*)(w + col * k);
  for (i64 v0 = 0; v0 < vecs; v0 += 128) {
    uint4 q[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const i64 v = v0 + u * 32 + lane;
      if (v < vecs) q[u] = wr[v];
    }
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const i64 v = v0 + u * 32 + lane;
      if (v >= vecs) break;
      float wv[8];
      unpack8<W>(q[u], wv);
#pragma unroll
      for (int r = 0; r < MR; r++) {
        if (r >= m) break;
        float xv[8];
        ldx8<X>(x + r * k + v * 8, xv);
#pragma unroll
        for (int e = 0; e < 8; e++) acc[r] = fmaf(xv[e], wv[e], acc[r]);
      }
    }
  }
}

// y [m, n] = x [m, k] · dequant(w)ᵀ; blockDim 128 (four columns per block).
template <class X, int BITS, int MR>
__device__ __forceinline__ void qgemv(const void* x, int m, const unsigned* w, const void* s, const void* z, int sdt,
                                      void* y, int ydt, i64 n, i64 k, int group) {
  const i64 col = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (col >= n) return;
  float acc[MR];
#pragma unroll
  for (int r = 0; r < MR; r++) acc[r] = 0.0f;
  qdot_rows<X, BITS, MR>((const typename X::T*)x, m, k, w, s, z, sdt, col, group, acc);
#pragma unroll
  for (int r = 0; r < MR; r++) {
    if (r >= m) break;
    const float v = warp_sum(acc[r]);
    if ((threadIdx.x & 31) == 0) stf(y, ydt, r * n + col, v);
  }
}

// y = silu(x·Gᵀ) · (x·Uᵀ) for two quantized weights of one shape, rounding each intermediate to
// the dtype the unfused graph stores it in (gdt for both products, sdt_silu for the SiLU).
template <class X, int BITS, int MR>
__device__ __forceinline__ void qgemv_glu(const void* x, int m, const unsigned* wg, const void* sg, const void* zg,
                                          const unsigned* wu, const void* su, const void* zu, int sdt, void* y,
                                          int ydt, int gdt, int silu_dt, i64 n, i64 k, int group) {
  const i64 col = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (col >= n) return;
  float g[MR], u[MR];
#pragma unroll
  for (int r = 0; r < MR; r++) { g[r] = 0.0f; u[r] = 0.0f; }
  qdot_rows<X, BITS, MR>((const typename X::T*)x, m, k, wg, sg, zg, sdt, col, group, g);
  qdot_rows<X, BITS, MR>((const typename X::T*)x, m, k, wu, su, zu, sdt, col, group, u);
#pragma unroll
  for (int r = 0; r < MR; r++) {
    if (r >= m) break;
    const float a = round_to(warp_sum(g[r]), gdt), b = round_to(warp_sum(u[r]), gdt);
    const float act = round_to(a / (1.0f + expf(-a)), silu_dt);
    if ((threadIdx.x & 31) == 0) stf(y, ydt, r * n + col, act * b);
  }
}

template <class X, class W, int MR>
__device__ __forceinline__ void dgemv_glu(const void* x, int m, const void* wg, const void* wu, void* y, int ydt,
                                          int gdt, int silu_dt, i64 n, i64 k) {
  const i64 col = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (col >= n) return;
  float g[MR], u[MR];
#pragma unroll
  for (int r = 0; r < MR; r++) { g[r] = 0.0f; u[r] = 0.0f; }
  ddot_rows<X, W, MR>((const typename X::T*)x, m, k, (const unsigned short*)wg, col, g);
  ddot_rows<X, W, MR>((const typename X::T*)x, m, k, (const unsigned short*)wu, col, u);
#pragma unroll
  for (int r = 0; r < MR; r++) {
    if (r >= m) break;
    const float a = round_to(warp_sum(g[r]), gdt), b = round_to(warp_sum(u[r]), gdt);
    const float act = round_to(a / (1.0f + expf(-a)), silu_dt);
    if ((threadIdx.x & 31) == 0) stf(y, ydt, r * n + col, act * b);
  }
}

template <class X, class W, int MR>
__device__ __forceinline__ void dgemv(const void* x, int m, const void* w, void* y, int ydt, i64 n, i64 k) {
  const i64 col = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (col >= n) return;
  float acc[MR];
#pragma unroll
  for (int r = 0; r < MR; r++) acc[r] = 0.0f;
  ddot_rows<X, W, MR>((const typename X::T*)x, m, k, (const unsigned short*)w, col, acc);
#pragma unroll
  for (int r = 0; r < MR; r++) {
    if (r >= m) break;
    const float v = warp_sum(acc[r]);
    if ((threadIdx.x & 31) == 0) stf(y, ydt, r * n + col, v);
  }
}

// Entry points: qgemv_{x}_{bits}_{1|8}, qglu_{x}_{bits}_{1|8}, dgemv_{x}_{w}_{1|8}.
#define QGEMV(XN, X, BITS, MR)                                                                                    \
  extern "C" __global__ void qgemv_##XN##_##BITS##_##MR(const void* x, int m, const unsigned* w, const void* s,    \
                                                        const void* z, int sdt, void* y, int ydt, i64 n, i64 k,   \
                                                        int group) {                                              \
    qgemv<X, BITS, MR>(x, m, w, s, z, sdt, y, ydt, n, k, group);                                                  \
  }                                                                                                               \
  extern "C" __global__ void qglu_##XN##_##BITS##_##MR(                                                           \
      const void* x, int m, const unsigned* wg, const void* sg, const void* zg, const unsigned* wu, const void* su, \
      const void* zu, int sdt, void* y, int ydt, int gdt, int silu_dt, i64 n, i64 k, int group) {                 \
    qgemv_glu<X, BITS, MR>(x, m, wg, sg, zg, wu, su, zu, sdt, y, ydt, gdt, silu_dt, n, k, group);                 \
  }
#define QGEMV_X(XN, X) QGEMV(XN, X, 4, 1) QGEMV(XN, X, 4, 8) QGEMV(XN, X, 8, 1) QGEMV(XN, X, 8, 8)
QGEMV_X(f32, F32)
QGEMV_X(f16, F16)
QGEMV_X(bf16, BF16)

#define DGEMV(XN, X, WN, W, MR)                                                                                   \
  extern "C" __global__ void dgemv_##XN##_##WN##_##MR(const void* x, int m, const void* w, void* y, int ydt, i64 n, \
                                                      i64 k) {                                                    \
    dgemv<X, W, MR>(x, m, w, y, ydt, n, k);                                                                       \
  }                                                                                                               \
  extern "C" __global__ void dglu_##XN##_##WN##_##MR(const void* x, int m, const void* wg, const void* wu, void* y, \
                                                     int ydt, int gdt, int silu_dt, i64 n, i64 k) {               \
    dgemv_glu<X, W, MR>(x, m, wg, wu, y, ydt, gdt, silu_dt, n, k);                                                \
  }
#define DGEMV_X(XN, X) DGEMV(XN, X, f16, F16, 1) DGEMV(XN, X, f16, F16, 8) DGEMV(XN, X, bf16, BF16, 1) DGEMV(XN, X, bf16, BF16, 8)
DGEMV_X(f32, F32)
DGEMV_X(f16, F16)
DGEMV_X(bf16, BF16)
