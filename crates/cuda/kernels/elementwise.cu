// Unary, binary, compare, where, astype. Operands share shape (the builder broadcast them).

__device__ float erf_f(float x) { return erff(x); }

__device__ __forceinline__ float unary_op(int op, float x, float p) {
  switch (op) {
    case 0: return -x;
    case 1: return fabsf(x);
    case 2: return expf(x);
    case 3: return logf(x);
    case 4: return sqrtf(x);
    case 5: return rsqrtf(x);
    case 6: return tanhf(x);
    case 7: return 1.0f / (1.0f + expf(-x));
    case 8: return x / (1.0f + expf(-x));
    case 9: return 0.5f * x * (1.0f + erf_f(x * 0.70710678118654752f));
    case 10: { const float c = 0.7978845608028654f; return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x))); }
    case 11: return p * tanhf(x / p);
    case 12: return sinf(x);
    default: return cosf(x);
  }
}

template <typename D>
__device__ void unary(int op, float p, const typename D::T* x, typename D::T* y, i64 n) {
  for (i64 i = gid(); i < n; i += gstride()) D::st(y, i, unary_op(op, D::ld(x, i), p));
}

__device__ __forceinline__ float binary_op(int op, float a, float b) {
  switch (op) {
    case 0: return a + b;
    case 1: return a - b;
    case 2: return a * b;
    case 3: return a / b;
    case 4: return (isnan(a) || isnan(b)) ? NAN : fmaxf(a, b);
    default: return (isnan(a) || isnan(b)) ? NAN : fminf(a, b);
  }
}

template <typename D>
__device__ void binary(int op, const typename D::T* a, const typename D::T* b, typename D::T* y, i64 n) {
  for (i64 i = gid(); i < n; i += gstride()) D::st(y, i, binary_op(op, D::ld(a, i), D::ld(b, i)));
}

// Integer arithmetic wraps (two's complement) like the CPU's.
template <typename T>
__device__ void binary_int(int op, const T* a, const T* b, T* y, i64 n) {
  for (i64 i = gid(); i < n; i += gstride()) {
    T x = a[i], z = b[i];
    T r = op == 0 ? (T)(x + z) : op == 1 ? (T)(x - z) : op == 2 ? (T)(x * z) : op == 4 ? (x > z ? x : z) : (x < z ? x : z);
    y[i] = r;
  }
}

// Compare any dtype: read as double (exact for all of ours).
__device__ __forceinline__ double ld_any(const void* p, int dt, i64 i) {
  switch (dt) {
    case 0: return ((const float*)p)[i];
    case 1: return F16::ld((const unsigned short*)p, i);
    case 2: return BF16::ld((const unsigned short*)p, i);
    case 3: return ((const int*)p)[i];
    case 4: return ((const unsigned*)p)[i];
    default: return ((const unsigned char*)p)[i];
  }
}

extern "C" __global__ void compare_any(int op, int dt, const void* a, const void* b, unsigned char* y, i64 n) {
  for (i64 i = gid(); i < n; i += gstride()) {
    double x = ld_any(a, dt, i), z = ld_any(b, dt, i);
    bool r = op == 0 ? x == z : op == 1 ? x != z : op == 2 ? x < z : op == 3 ? x <= z : op == 4 ? x > z : x >= z;
    y[i] = r ? 1 : 0;
  }
}

// cond ? a : b on raw elements of `size` bytes (1, 2 or 4).
extern "C" __global__ void select_any(const unsigned char* c, const void* a, const void* b, void* y, int size, i64 n) {
  for (i64 i = gid(); i < n; i += gstride()) {
    const void* s = c[i] ? a : b;
    if (size == 4) ((unsigned*)y)[i] = ((const unsigned*)s)[i];
    else if (size == 2) ((unsigned short*)y)[i] = ((const unsigned short*)s)[i];
    else ((unsigned char*)y)[i] = ((const unsigned char*)s)[i];
  }
}

// Conversion with the CPU's semantics: floats round to nearest even, to integers truncate
// toward zero saturating (NaN → 0), to bool is != 0. dt codes as in ld_any.
extern "C" __global__ void astype_any(int from, const void* x, int to, void* y, i64 n) {
  for (i64 i = gid(); i < n; i += gstride()) {
    double v = ld_any(x, from, i);
    switch (to) {
      case 0: ((float*)y)[i] = (float)v; break;
      case 1: F16::st((unsigned short*)y, i, (float)v); break;
      case 2: BF16::st((unsigned short*)y, i, (float)v); break;
      case 3: ((int*)y)[i] = isnan(v) ? 0 : v >= 2147483647.0 ? 2147483647 : v <= -2147483648.0 ? (-2147483647 - 1) : (int)v; break;
      case 4: ((unsigned*)y)[i] = isnan(v) || v <= 0.0 ? 0u : v >= 4294967295.0 ? 4294967295u : (unsigned)v; break;
      case 5: ((unsigned char*)y)[i] = isnan(v) || v <= 0.0 ? 0 : v >= 255.0 ? 255 : (unsigned char)v; break;
      default: ((unsigned char*)y)[i] = v != 0.0 ? 1 : 0; break;
    }
  }
}

// y = act(g) · u, the gated MLP's product where the GEMV does not take it (a prefill's):
// act(g) rounded to D as the unary kernel stores it, then the product rounded as the binary
// kernel's, so the pair's result is unchanged with one pass over memory fewer.
template <typename D>
__device__ void act_mul(int op, const typename D::T* g, const typename D::T* u, typename D::T* y, i64 n) {
  for (i64 i = gid(); i < n; i += gstride()) {
    const float gv = D::ld(g, i), uv = D::ld(u, i);
    typename D::T a[1];
    D::st(a, 0, unary_op(op, gv, 0.0f));
    D::st(y, i, D::ld(a, 0) * uv);
  }
}

#define FLOAT_KERNELS(S, D)                                                                           \
  extern "C" __global__ void unary_##S(int op, float p, const D::T* x, D::T* y, i64 n) { unary<D>(op, p, x, y, n); } \
  extern "C" __global__ void binary_##S(int op, const D::T* a, const D::T* b, D::T* y, i64 n) { binary<D>(op, a, b, y, n); } \
  extern "C" __global__ void act_mul_##S(int op, const D::T* g, const D::T* u, D::T* y, i64 n) { act_mul<D>(op, g, u, y, n); }
FLOAT_KERNELS(f32, F32)
FLOAT_KERNELS(f16, F16)
FLOAT_KERNELS(bf16, BF16)

extern "C" __global__ void binary_i32(int op, const int* a, const int* b, int* y, i64 n) { binary_int<int>(op, a, b, y, n); }
extern "C" __global__ void binary_u32(int op, const unsigned* a, const unsigned* b, unsigned* y, i64 n) { binary_int<unsigned>(op, a, b, y, n); }
extern "C" __global__ void unary_i32(int op, float p, const int* x, int* y, i64 n) {
  for (i64 i = gid(); i < n; i += gstride()) y[i] = op == 0 ? -x[i] : (x[i] < 0 ? -x[i] : x[i]);
}
