// Shared by every kernel file (prepended before compilation; no CUDA headers needed).
// Storage types: float, and f16/bf16 as raw 16-bit words converted by hand, so NVRTC needs no
// toolkit headers. Kernels load to f32, compute in f32, store once.
#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fffffff)
typedef long long i64;
typedef unsigned long long u64;

// DT: the type's runtime dtype code (ldf, stf, round_to).
struct F32 {
  typedef float T;
  static constexpr int DT = 0;
  static __device__ __forceinline__ float ld(const T* p, i64 i) { return p[i]; }
  static __device__ __forceinline__ void st(T* p, i64 i, float v) { p[i] = v; }
};
struct F16 {
  typedef unsigned short T;
  static constexpr int DT = 1;
  static __device__ __forceinline__ float ld(const T* p, i64 i) {
    float f; unsigned short h = p[i];
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
  }
  static __device__ __forceinline__ void st(T* p, i64 i, float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    p[i] = h;
  }
};
struct BF16 {
  typedef unsigned short T;
  static constexpr int DT = 2;
  static __device__ __forceinline__ float ld(const T* p, i64 i) { return __uint_as_float(((unsigned)p[i]) << 16); }
  static __device__ __forceinline__ void st(T* p, i64 i, float v) {
    unsigned u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) { p[i] = (unsigned short)((u >> 16) | 0x40); return; }  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    p[i] = (unsigned short)(u >> 16);
  }
};
struct I32 {
  typedef int T;
  static __device__ __forceinline__ float ld(const T* p, i64 i) { return (float)p[i]; }
  static __device__ __forceinline__ void st(T* p, i64 i, float v) { p[i] = (int)v; }
};
struct U32 {
  typedef unsigned T;
  static __device__ __forceinline__ float ld(const T* p, i64 i) { return (float)p[i]; }
  static __device__ __forceinline__ void st(T* p, i64 i, float v) { p[i] = (unsigned)v; }
};

// Integer reads of ids/positions/lengths: `kind` 0 = int32, 1 = uint32, 2 = uint8.
__device__ __forceinline__ i64 ld_index(const void* p, int kind, i64 i) {
  if (kind == 0) return ((const int*)p)[i];
  if (kind == 1) return ((const unsigned*)p)[i];
  return ((const unsigned char*)p)[i];
}

__device__ __forceinline__ i64 gid() { return (i64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ i64 gstride() { return (i64)gridDim.x * blockDim.x; }

// Reduce over the 32 lanes of a warp.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Block-wide sum (blockDim.x a multiple of 32, at most 1024); every thread gets the total.
__device__ float block_sum(float v) {
  __shared__ float part[32];
  v = warp_sum(v);
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  int warps = blockDim.x >> 5;
  v = (threadIdx.x < warps) ? part[threadIdx.x] : 0.0f;
  if (warp == 0) v = warp_sum(v);
  if (threadIdx.x == 0) part[0] = v;
  __syncthreads();
  return part[0];
}
__device__ float block_max(float v) {
  __shared__ float part[32];
  v = warp_max(v);
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  int warps = blockDim.x >> 5;
  v = (threadIdx.x < warps) ? part[threadIdx.x] : -INFINITY;
  if (warp == 0) v = warp_max(v);
  if (threadIdx.x == 0) part[0] = v;
  __syncthreads();
  return part[0];
}

// Programmatic dependent launch (sm_90 on): a kernel launched with it (launch_programmatic in
// device/mod.rs) may start while the kernel before it drains, and calls pdl_wait() before it
// reads what earlier kernels wrote or writes anything; pdl_trigger() lets such a next kernel
// start early. Both are no-ops for plain launches and older GPUs.
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// Any float dtype by runtime code (0 f32, 1 f16, 2 bf16): for ops whose operands may differ
// in dtype (weights widened in the kernel). The code is uniform per launch, so no divergence.
// ld_bits and bits_float are ldf's two halves: the raw bits now, the float where it is used
// (a prefetch across a loop iteration). Neither branches (the load is predicated, the
// conversion a select), so a run of ldf issues all its loads before the first conversion
// waits; with a branch a dtype around each load and its conversion, each load had waited for
// the one before, a memory round trip an element.
__device__ __forceinline__ unsigned ld_bits(const void* p, int dt, i64 i) {
  unsigned r;
  if (dt == 0) r = ((const unsigned*)p)[i];
  else r = ((const unsigned short*)p)[i];
  return r;
}
__device__ __forceinline__ float bits_float(unsigned r, int dt) {
  float h;
  asm("cvt.f32.f16 %0, %1;" : "=f"(h) : "h"((unsigned short)r));
  return dt == 0 ? __uint_as_float(r) : dt == 1 ? h : __uint_as_float(r << 16);
}
__device__ __forceinline__ float ldf(const void* p, int dt, i64 i) { return bits_float(ld_bits(p, dt, i), dt); }
// ldf through L2 only (ld.global.cg): a value another block of the launch wrote, made visible by
// its __threadfence, which this block's L1 may hold stale.
__device__ __forceinline__ float ldf_cg(const void* p, int dt, i64 i) {
  return bits_float(dt == 0 ? __ldcg((const unsigned*)p + i) : (unsigned)__ldcg((const unsigned short*)p + i), dt);
}
__device__ __forceinline__ void stf(void* p, int dt, i64 i, float v) {
  if (dt == 0) ((float*)p)[i] = v;
  else if (dt == 1) F16::st((unsigned short*)p, i, v);
  else BF16::st((unsigned short*)p, i, v);
}

// Rounds v to dtype code dt (as a store and reload would).
__device__ __forceinline__ float round_to(float v, int dt) {
  if (dt == 0) return v;
  unsigned short h;
  if (dt == 1) { F16::st(&h, 0, v); return F16::ld(&h, 0); }
  BF16::st(&h, 0, v);
  return BF16::ld(&h, 0);
}

// ---- MoE routing, shared by index.cu's moe_route and gemv.cu's routed GLU ------------------
// A candidate as one 64-bit key whose order is the top-k sort order: the value's bits made
// monotonic (NaN above everything, -0 as +0), below them the index, complemented unless `high`
// (ties to the lower index, or the higher). Every real key has a nonzero high word.
__device__ __forceinline__ unsigned long long order_key(float f, int i, int high) {
  unsigned b = __float_as_uint(f == 0.0f ? 0.0f : f);
  const unsigned u = isnan(f) ? 0xffffffffu : (b & 0x80000000u) ? ~b : b | 0x80000000u;
  return (unsigned long long)u << 32 | (high ? (unsigned)i : ~(unsigned)i);
}
// The value back from its key (a NaN as the canonical one, -0 as +0; 0 for the empty key).
__device__ __forceinline__ float key_value(unsigned long long key) {
  const unsigned u = (unsigned)(key >> 32);
  return key == 0 ? 0.0f : u == 0xffffffffu ? __uint_as_float(0x7fffffffu)
                                            : __uint_as_float(u & 0x80000000u ? u & 0x7fffffffu : ~u);
}

// Row `row` of a router's softmax over logits [.., e] (e <= 256), one warp: element lane + 32t
// in v[t] (0 past e), rounded to dt as the plain softmax stores it, its sum added in the plain
// 256-thread kernel's order (block_sum: each warp's butterfly, then a butterfly over the 8
// warps' sums; element 32t + lane is thread 32t + lane's one value there), so the probabilities
// equal the unfused graph's. Every lane of the warp calls it.
__device__ __forceinline__ void router_probs(const void* logits, int dt, i64 row, i64 e, int lane, float* v) {
  float m = -INFINITY;
#pragma unroll
  for (int t = 0; t < 8; t++) {
    const i64 i = lane + 32 * t;
    v[t] = i < e ? ldf(logits, dt, row * e + i) : -INFINITY;
    m = fmaxf(m, v[t]);
  }
  m = warp_max(m);
  float part[8];
#pragma unroll
  for (int t = 0; t < 8; t++) {
    v[t] = lane + 32 * t < e && m != -INFINITY ? expf(v[t] - m) : 0.0f;
    part[t] = __shfl_sync(0xffffffffu, warp_sum(v[t]), 0);
  }
  const float s = ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
  const float inv = m == -INFINITY ? 0.0f : 1.0f / s;
#pragma unroll
  for (int t = 0; t < 8; t++) v[t] = round_to(v[t] * inv, dt);
}

// A token's router weights as the plain graph makes them from its top k (k <= 32): lane r < k
// holds the r-th chosen probability in `chosen` (the others 0); with `renorm` each is divided
// by their sum, added as the plain sum kernel adds k values (warp 0's butterfly) and rounded to
// dt. Every lane of the warp calls it; lane r < k gets weight r (unrounded: stf rounds it).
__device__ __forceinline__ float router_weight(float chosen, int dt, int renorm) {
  const float total = round_to(__shfl_sync(0xffffffffu, warp_sum(chosen), 0), dt);
  return renorm ? chosen / total : chosen;
}
