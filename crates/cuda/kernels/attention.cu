// Prefill attention on the tensor cores, flash-attention style: f16 or bf16 q, k and v, the
// head size D = Dv 64 or 128. Block (query tile, b·hq) of 4 warps takes 64 query rows, 16 a
// warp; keys come in tiles of 64 staged row-major in shared memory. Scores come from
// mma.m16n8k16 with f32 accumulation; each row keeps a running max and sum (online softmax);
// the probabilities, rounded to x's dtype, multiply the values on the tensor cores too.
// Parameters as `attention`'s (nn.cu), then heads_last (the output as [B, T, Hq, D]); the length
// is read from device memory. Queries t sit at positions len - t .. len - 1; keys at or past
// len are never read.
#define FA_BQ 64
#define FA_BK 64

// a and b (f32) as one register of two halves of X: a the lower (the lower column).
template <class X> __device__ __forceinline__ unsigned fa_pack(float a, float b);
template <> __device__ __forceinline__ unsigned fa_pack<F16>(float a, float b) {
  unsigned r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
  return r;
}
template <> __device__ __forceinline__ unsigned fa_pack<BF16>(float a, float b) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
  return r;
}

__device__ __forceinline__ unsigned fa_smem(const void* p) {
  unsigned a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

// Rows [j0, j0 + FA_BK) of a cache head (D halves a row) into dst [FA_BK][D + 8]; rows at or
// past hi as zeros (unwritten slots may hold anything, NaN included).
template <int D>
__device__ __forceinline__ void fa_load_tile(unsigned short (*dst)[D + 8], const unsigned short* src, i64 j0, i64 hi) {
  for (int i = threadIdx.x; i < FA_BK * D / 8; i += blockDim.x) {
    const int r = i / (D / 8), c = i % (D / 8);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (j0 + r < hi) v = ((const uint4*)(src + (j0 + r) * D))[c];
    *(uint4*)&dst[r][c * 8] = v;
  }
}

template <class X, int D>
__device__ __forceinline__ void flash_prefill(const void* q_, const void* k_, const void* v_, const void* kv_len,
                                              int len_kind, int len_count, void* y, int ydt, i64 hq, i64 hkv, i64 t,
                                              i64 s, float scale, int causal, i64 window, float softcap, int* error,
                                              int tag, int heads_last) {
  typedef TensorCore<X> TC;
  __shared__ __align__(16) unsigned short ks[FA_BK][D + 8];  // 16 bytes of padding a row: no
  __shared__ __align__(16) unsigned short vs[FA_BK][D + 8];  // bank conflicts on fragment reads
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const i64 bh = blockIdx.y, bi = bh / hq, kvh = (bh % hq) / (hq / hkv);
  const i64 len = ld_index(kv_len, len_kind, len_count == 1 ? 0 : bi);
  if (len < t || len > s) {
    if (threadIdx.x == 0) atomicCAS(error, 0, tag);
    return;
  }
  const i64 q0 = (i64)blockIdx.x * FA_BQ, last = (q0 + FA_BQ < t ? q0 + FA_BQ : t) - 1;
  // The block's keys: up to its last row's position (causal) or the length; from its first
  // row's window start.
  const i64 kv_hi = causal ? len - t + last + 1 : len;
  const i64 first_lo = window > 0 ? len - t + q0 + 1 - window : 0;
  const i64 kv_lo = first_lo > 0 ? first_lo : 0;
  // This lane's rows ra, rb = ra + 8 of the warp's 16, and the keys each may see [lo, hi).
  const i64 ra = q0 + warp * 16 + g, rb = ra + 8;
  i64 hi_r[2], lo_r[2];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const i64 p = len - t + (h ? rb : ra);
    const i64 hi = causal ? p + 1 : len;
    hi_r[h] = hi < kv_hi ? hi : kv_hi;
    lo_r[h] = window > 0 ? p + 1 - window : 0;
  }
  const unsigned short* qh = (const unsigned short*)q_ + bh * t * D;
  const unsigned short* kh = (const unsigned short*)k_ + (bi * hkv + kvh) * s * D;
  const unsigned short* vh = (const unsigned short*)v_ + (bi * hkv + kvh) * s * D;
  // Q as A fragments, one a 16-wide slice of the head (rows past t as zeros).
  unsigned qa[D / 16][4];
#pragma unroll
  for (int j = 0; j < D / 16; j++) {
    const int c = 16 * j + 2 * tq;
    qa[j][0] = ra < t ? *(const unsigned*)(qh + ra * D + c) : 0u;
    qa[j][1] = rb < t ? *(const unsigned*)(qh + rb * D + c) : 0u;
    qa[j][2] = ra < t ? *(const unsigned*)(qh + ra * D + c + 8) : 0u;
    qa[j][3] = rb < t ? *(const unsigned*)(qh + rb * D + c + 8) : 0u;
  }
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (i64 j0 = kv_lo; j0 < kv_hi; j0 += FA_BK) {
    __syncthreads();  // the last tile's readers are done
    fa_load_tile<D>(ks, kh, j0, kv_hi);
    fa_load_tile<D>(vs, vh, j0, kv_hi);
    __syncthreads();
    // Scores of rows (ra, rb) against keys j0 + 8n + 2tq + {0, 1}.
    float sc[FA_BK / 8][4];
#pragma unroll
    for (int n = 0; n < FA_BK / 8; n++) {
      sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
      for (int j = 0; j < D / 16; j++) {
        const unsigned short* kr = &ks[8 * n + g][16 * j + 2 * tq];
        TC::mma(sc[n], qa[j], *(const unsigned*)kr, *(const unsigned*)(kr + 8));
      }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < FA_BK / 8; n++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int h = e >> 1;
        const i64 key = j0 + 8 * n + 2 * tq + (e & 1);
        float v = sc[n][e] * scale;
        if (softcap > 0.0f) v = softcap * tanhf(v / softcap);
        v = key < hi_r[h] && key >= lo_r[h] ? v : -INFINITY;
        sc[n][e] = v;
        mx[h] = fmaxf(mx[h], v);
      }
    }
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      const float mn = fmaxf(m[h], mx[h]);
      const float base = mn == -INFINITY ? 0.0f : mn;  // no key yet: keep everything at 0
      alpha[h] = __expf(m[h] - base);
      m[h] = mn;
      mx[h] = base;
      l[h] *= alpha[h];
    }
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
    // Probabilities as A fragments of P · V: k-step kk is keys 16kk .. 16kk + 15, which are the
    // score tiles 2kk and 2kk + 1 in the accumulator layout already.
    unsigned pa[FA_BK / 16][4];
#pragma unroll
    for (int n = 0; n < FA_BK / 8; n++) {
      float p[4];
#pragma unroll
      for (int e = 0; e < 4; e++) {
        p[e] = __expf(sc[n][e] - mx[e >> 1]);
        l[e >> 1] += p[e];
      }
      pa[n / 2][(n & 1) * 2 + 0] = fa_pack<X>(p[0], p[1]);
      pa[n / 2][(n & 1) * 2 + 1] = fa_pack<X>(p[2], p[3]);
    }
    // V's B fragments by ldmatrix.trans: matrices (keys 16kk + 0..7 | 8..15) x (dims 16d + 0..7 |
    // 8..15); lane i names row (i & 7) + 8·((i >> 3) & 1), column 8·(i >> 4) of the pair.
    const int vr = (lane & 7) + ((lane >> 3) & 1) * 8, vc = (lane >> 4) * 8;
#pragma unroll
    for (int kk = 0; kk < FA_BK / 16; kk++) {
#pragma unroll
      for (int d = 0; d < D / 16; d++) {
        unsigned b0, b1, b2, b3;
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3)
                     : "r"(fa_smem(&vs[16 * kk + vr][16 * d + vc])));
        TC::mma(o[2 * d], pa[kk], b0, b1);
        TC::mma(o[2 * d + 1], pa[kk], b2, b3);
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; h++) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
  const float inv[2] = {l[0] > 0.0f ? 1.0f / l[0] : 0.0f, l[1] > 0.0f ? 1.0f / l[1] : 0.0f};
  // Row r's output: y [B, Hq, T, D], or with heads_last y [B, T, Hq, D] (the layout the output
  // projection reads, its transpose done by this store).
  auto out_at = [&](i64 r) { return heads_last ? ((bi * t + r) * hq + bh % hq) * D : (bh * t + r) * D; };
  const i64 ya = out_at(ra), yb = out_at(rb);
#pragma unroll
  for (int n = 0; n < D / 8; n++) {
    const i64 c = 8 * n + 2 * tq;
    if (ra < t) {
      stf(y, ydt, ya + c, o[n][0] * inv[0]);
      stf(y, ydt, ya + c + 1, o[n][1] * inv[0]);
    }
    if (rb < t) {
      stf(y, ydt, yb + c, o[n][2] * inv[1]);
      stf(y, ydt, yb + c + 1, o[n][3] * inv[1]);
    }
  }
}

#define FLASH_PREFILL(XN, X, D)                                                                                        \
  extern "C" __global__ void __launch_bounds__(128) flash_prefill_##XN##_##D(                                          \
      const void* q, int, const void* k, const void* v, int, const void* kv_len, int len_kind, int len_count, void* y, \
      int ydt, i64 hq, i64 hkv, i64 t, i64 s, i64, i64, float scale, int causal, i64 window, float softcap,            \
      int* error, int tag, int heads_last) {                                                                           \
    flash_prefill<X, D>(q, k, v, kv_len, len_kind, len_count, y, ydt, hq, hkv, t, s, scale, causal, window, softcap,  \
                        error, tag, heads_last);                                                                       \
  }
FLASH_PREFILL(f16, F16, 64)
FLASH_PREFILL(f16, F16, 128)
FLASH_PREFILL(bf16, BF16, 64)
FLASH_PREFILL(bf16, BF16, 128)
