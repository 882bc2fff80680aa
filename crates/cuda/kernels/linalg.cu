// Dense and affine-quantized matmul. Correct first: one thread (dense) or one warp
// (quantized) per output element; fast decode kernels come later.

// y [batch, M, N] = a [batch, M, K] @ b, b [K, N] or (transposed) [N, K]; b_batch 0 = shared.
extern "C" __global__ void matmul(const void* a, int adt, const void* b, int bdt, void* y, int ydt, i64 batch, i64 m,
                                  i64 n, i64 k, int trans_b, int b_batched) {
  for (i64 idx = gid(); idx < batch * m * n; idx += gstride()) {
    i64 bi = idx / (m * n), r = (idx / n) % m, c = idx % n;
    const i64 ao = (bi * m + r) * k, bo = b_batched ? bi * k * n : 0;
    float acc = 0.0f;
    for (i64 kk = 0; kk < k; kk++) {
      float bv = trans_b ? ldf(b, bdt, bo + c * k + kk) : ldf(b, bdt, bo + kk * n + c);
      acc += ldf(a, adt, ao + kk) * bv;
    }
    stf(y, ydt, idx, acc);
  }
}

// One warp computes Σ_k x[k] · (q[row, k] · s + z) over a packed row.
__device__ __forceinline__ float qrow_dot(const void* x, int xdt, i64 xo, const unsigned* w, i64 row, const void* s,
                                          const void* z, int sdt, i64 k, int bits, int group) {
  const int per = 32 / bits;
  const unsigned mask = (1u << bits) - 1u;
  const i64 words = k / per, groups = k / group;
  float acc = 0.0f;
  for (i64 wi = threadIdx.x & 31; wi < words; wi += 32) {
    unsigned word = w[row * words + wi];
    i64 j0 = wi * per;
    i64 g = row * groups + j0 / group;
    float sc = ldf(s, sdt, g), bi = ldf(z, sdt, g);
    for (int e = 0; e < per; e++) {
      float q = (float)((word >> (e * bits)) & mask);
      acc += ldf(x, xdt, xo + j0 + e) * (q * sc + bi);
    }
  }
  return warp_sum(acc);
}

// y [M, N] = x [M, K] @ dequant(w [N, K·bits/32])ᵀ
extern "C" __global__ void qmm(const void* x, int xdt, const unsigned* w, const void* s, const void* z, int sdt, void* y,
                               int ydt, i64 m, i64 n, i64 k, int bits, int group) {
  i64 warp = gid() >> 5, warps = gstride() >> 5;
  for (i64 o = warp; o < m * n; o += warps) {
    i64 r = o / n, c = o % n;
    float v = qrow_dot(x, xdt, r * k, w, c, s, z, sdt, k, bits, group);
    if ((threadIdx.x & 31) == 0) stf(y, ydt, o, v);
  }
}

// y [P, N] for P = R·top (token, slot) pairs: expert ids[p] applied to x row (X = 1: row p/top).
extern "C" __global__ void gather_qmm(const void* x, int xdt, i64 x_rows, const unsigned* w, const void* s,
                                      const void* z, int sdt, const void* ids, int id_kind, void* y, int ydt, i64 pairs,
                                      i64 top, i64 experts, i64 n, i64 k, int bits, int group, int* error, int tag) {
  i64 warp = gid() >> 5, warps = gstride() >> 5;
  for (i64 o = warp; o < pairs * n; o += warps) {
    i64 p = o / n, c = o % n;
    i64 e = ld_index(ids, id_kind, p);
    if (e < 0 || e >= experts) { if ((threadIdx.x & 31) == 0) atomicCAS(error, 0, tag); continue; }
    i64 xr = (p / top) * x_rows + (x_rows == 1 ? 0 : p % top);
    float v = qrow_dot(x, xdt, xr * k, w, e * n + c, s, z, sdt, k, bits, group);
    if ((threadIdx.x & 31) == 0) stf(y, ydt, o, v);
  }
}

// y [batch, M, N] = a [batch, M, K] @ bᵀ for b [N, K] (linear layers): one warp per output,
// lanes reading consecutive elements of a row of b, so loads coalesce.
extern "C" __global__ void matmul_t_warp(const void* a, int adt, const void* b, int bdt, void* y, int ydt, i64 batch,
                                         i64 m, i64 n, i64 k, int b_batched) {
  i64 warp = gid() >> 5, warps = gstride() >> 5;
  const int lane = threadIdx.x & 31;
  for (i64 o = warp; o < batch * m * n; o += warps) {
    i64 bi = o / (m * n), r = (o / n) % m, c = o % n;
    const i64 ao = (bi * m + r) * k, bo = (b_batched ? bi * n * k : 0) + c * k;
    float acc = 0.0f;
    for (i64 kk = lane; kk < k; kk += 32) acc += ldf(a, adt, ao + kk) * ldf(b, bdt, bo + kk);
    acc = warp_sum(acc);
    if (lane == 0) stf(y, ydt, o, acc);
  }
}

// out [N, K] (dtype odt) = dequant(w [N, K·bits/32]): the weight of a large prefill product,
// expanded once per run for cuBLAS.
extern "C" __global__ void dequant_rows(const unsigned* w, const void* s, const void* z, int sdt, void* out, int odt,
                                        i64 n, i64 k, int bits, int group) {
  const int per = 32 / bits;
  const unsigned mask = (1u << bits) - 1u;
  const i64 groups = k / group;
  for (i64 idx = gid(); idx < n * k; idx += gstride()) {
    const i64 r = idx / k, j = idx % k;
    const unsigned word = w[r * (k / per) + j / per];
    const float q = (float)((word >> ((j % per) * bits)) & mask);
    const i64 g = r * groups + j / group;
    stf(out, odt, idx, q * ldf(s, sdt, g) + ldf(z, sdt, g));
  }
}
