// Gathers, sorting and sampling.

// Rows of table [V, row_bytes] at ids.
extern "C" __global__ void gather_rows(const unsigned char* table, i64 vocab, i64 row_bytes, const void* ids, int id_kind,
                                       i64 count, unsigned char* y, int* error, int tag) {
  for (i64 idx = gid(); idx < count * row_bytes; idx += gstride()) {
    i64 p = idx / row_bytes, c = idx % row_bytes;
    i64 id = ld_index(ids, id_kind, p);
    if (id < 0 || id >= vocab) { atomicCAS(error, 0, tag); continue; }
    y[idx] = table[id * row_bytes + c];
  }
}

// Quantized embedding rows dequantized into y [count, D].
extern "C" __global__ void quantized_gather(const unsigned* w, const void* s, const void* z, int sdt, i64 vocab, i64 d,
                                            int bits, int group, const void* ids, int id_kind, i64 count, void* y,
                                            int ydt, int* error, int tag) {
  const int per = 32 / bits;
  const unsigned mask = (1u << bits) - 1u;
  for (i64 idx = gid(); idx < count * d; idx += gstride()) {
    i64 p = idx / d, j = idx % d;
    i64 id = ld_index(ids, id_kind, p);
    if (id < 0 || id >= vocab) { atomicCAS(error, 0, tag); continue; }
    unsigned word = w[id * (d / per) + j / per];
    float q = (float)((word >> ((j % per) * bits)) & mask);
    i64 g = id * (d / group) + j / group;
    stf(y, ydt, idx, q * ldf(s, sdt, g) + ldf(z, sdt, g));
  }
}

// out [outer, m, inner] = x [outer, n, inner] at idx along the middle axis.
extern "C" __global__ void take_along(const unsigned char* x, int size, i64 outer, i64 n, i64 inner, const void* idx,
                                      int id_kind, i64 m, unsigned char* y, int* error, int tag) {
  for (i64 at = gid(); at < outer * m * inner; at += gstride()) {
    i64 i = at % inner, o = at / (m * inner);
    i64 k = ld_index(idx, id_kind, at);
    if (k < 0 || k >= n) { atomicCAS(error, 0, tag); continue; }
    i64 src = (o * n + k) * inner + i;
    for (int b = 0; b < size; b++) y[at * size + b] = x[src * size + b];
  }
}

// Does (value a at index ia) sort before (b at ib)? NaN counts as the largest value; ties by index.
__device__ __forceinline__ bool before(float a, i64 ia, float b, i64 ib, int descending) {
  bool an = isnan(a), bn = isnan(b);
  if (an || bn) {
    if (an && bn) return ia < ib;
    return descending ? an : bn;
  }
  if (a != b) return descending ? a > b : a < b;
  return ia < ib;
}

// The index `before` compares for element i: itself, or negated so that among equal values the
// higher index sorts first (TopK's higher_on_ties).
__device__ __forceinline__ i64 tie_key(i64 i, int high) { return high ? -i : i; }

// One thread per row: insertion sort of indices (rows are short: the host refuses long ones).
extern "C" __global__ void argsort_rows(const void* x, int dt, i64 rows, i64 n, int descending, i64 keep, unsigned* y,
                                        unsigned* scratch, int high) {
  for (i64 r = gid(); r < rows; r += gstride()) {
    unsigned* ix = scratch + r * n;
    for (i64 i = 0; i < n; i++) {
      float v = ldf(x, dt, r * n + i);
      i64 j = i;
      while (j > 0 && before(v, tie_key(i, high), ldf(x, dt, r * n + ix[j - 1]), tie_key(ix[j - 1], high), descending)) {
        ix[j] = ix[j - 1];
        j--;
      }
      ix[j] = (unsigned)i;
    }
    for (i64 i = 0; i < keep; i++) y[r * keep + i] = ix[i];
  }
}

// One round of a warp-wide selection over a row held T values a lane (element lane + 32 t in
// v[t]): the next element in sort order (descending, NaN first, ties by tie_key) among those not
// yet taken, marked taken. Every lane returns its index (-1 if none is left) and its value in bv.
template <int T>
__device__ __forceinline__ int warp_select_next(const float* v, i64 n, int high, int lane, unsigned& taken,
                                                float& bv) {
  bv = 0.0f;
  int bi = -1;
#pragma unroll
  for (int t = 0; t < T; t++) {
    const int i = lane + 32 * t;
    if (i < n && !((taken >> t) & 1u) && (bi < 0 || before(v[t], tie_key(i, high), bv, tie_key(bi, high), 1))) {
      bv = v[t];
      bi = i;
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
    if (oi >= 0 && (bi < 0 || before(ov, tie_key(oi, high), bv, tie_key(bi, high), 1))) { bv = ov; bi = oi; }
  }
  if (bi >= 0 && (bi & 31) == lane) taken |= 1u << (bi >> 5);
  return bi;
}

// The same selection without branches: each candidate as one 64-bit key whose order is the sort
// order (order_key, common.cuh), a warp maximum of the keys, and the winner's value read back
// from the key. Picks what warp_select_next picks for every input (n <= 2^31), returning a NaN as the
// canonical one and -0 as +0; `before`'s branches made each round of that one a chain of
// divergent paths.
template <int T>
__device__ __forceinline__ int warp_select_key(const float* v, i64 n, int high, int lane, unsigned& taken,
                                               float& bv) {
  unsigned long long best = 0;  // no candidate: every real key has a nonzero high word
#pragma unroll
  for (int t = 0; t < T; t++) {
    const int i = lane + 32 * t;
    const unsigned long long key = i < n && !((taken >> t) & 1u) ? order_key(v[t], i, high) : 0ull;
    best = key > best ? key : best;
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const unsigned long long o = __shfl_xor_sync(0xffffffffu, best, off);
    best = o > best ? o : best;
  }
  const unsigned low = (unsigned)best;
  const int bi = best == 0 ? -1 : (int)(high ? low : ~low);
  bv = key_value(best);
  if (bi >= 0 && (bi & 31) == lane) taken |= 1u << (bi >> 5);
  return bi;
}

// Top-k of short rows (n <= 1024, the MoE router's expert scores): one warp a row holds the
// row in registers (32 values a lane) and takes `keep` rounds of a warp-wide selection of the
// next element in sort order (descending, NaN first, ties by lower index, or higher with `high`)
// among those not yet taken, so the result equals argsort_rows' first `keep` entries.
extern "C" __global__ void topk_warp(const void* x, int dt, i64 rows, i64 n, i64 keep, unsigned* y, int high) {
  const i64 row = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  float v[32];
#pragma unroll
  for (int t = 0; t < 32; t++) {
    const i64 i = lane + 32 * t;
    v[t] = i < n ? ldf(x, dt, row * n + i) : 0.0f;
  }
  unsigned taken = 0;
  for (i64 r = 0; r < keep; r++) {
    float bv;
    const int bi = warp_select_next<32>(v, n, high, lane, taken, bv);
    if (lane == 0) y[row * keep + r] = (unsigned)bi;
  }
}

// The CPU's counter-based RNG (mlxcel_core::rng), bit for bit.
__device__ __forceinline__ u64 mix64(u64 x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
__device__ __forceinline__ float gumbel(u64 seed, unsigned counter, unsigned row, unsigned col) {
  u64 x = mix64(mix64(seed ^ (u64)counter) ^ (((u64)row << 32) | (u64)col));
  float u = ((float)(x >> 40) + 0.5f) * (1.0f / 16777216.0f);
  return -logf(-logf(u));
}

// One block per row: argmax of logits + Gumbel noise (the Gumbel-max draw).
extern "C" __global__ void sample_categorical(const void* logits, int dt, i64 vocab, const unsigned* counter, u64 seed,
                                              unsigned* y) {
  const i64 row = blockIdx.x;
  float best = -INFINITY; i64 at = 0; bool found = false;
  for (i64 j = threadIdx.x; j < vocab; j += blockDim.x) {
    float l = ldf(logits, dt, row * vocab + j);
    if (l == -INFINITY) continue;
    float sc = l + gumbel(seed, *counter, (unsigned)row, (unsigned)j);
    if (!found || sc > best) { best = sc; at = j; found = true; }
  }
  __shared__ float bv[1024]; __shared__ i64 bi[1024];
  bv[threadIdx.x] = found ? best : -INFINITY; bi[threadIdx.x] = found ? at : vocab;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      float v2 = bv[threadIdx.x + s]; i64 k2 = bi[threadIdx.x + s];
      if (v2 > bv[threadIdx.x] || (v2 == bv[threadIdx.x] && k2 < bi[threadIdx.x])) { bv[threadIdx.x] = v2; bi[threadIdx.x] = k2; }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) y[row] = (unsigned)(bi[0] >= vocab ? 0 : bi[0]);
}

// A MoE router after its product as one launch: softmax over the E experts of each row, the top
// k (descending, ties by tie_key), their probabilities, and with `renorm` those divided by their
// sum. A warp a row, E <= 256 (8 values a lane) and k <= 32. Every intermediate is rounded to dt
// as the plain graph (softmax, topk, take_along, sum, div) stores it, and both sums add in the
// order the plain 256-thread kernels do (block_sum: each warp's butterfly, lane 0's result, then
// a butterfly over the 8 warps' sums), so the ids and weights equal the unfused graph's.
// `keyed`: the branch-free selection (warp_select_key; the default, MLXCEL_ROUTE_KEYED=0 for the
// comparison-based one).
extern "C" __global__ void moe_route(const void* logits, int dt, i64 rows, i64 e, i64 k, int high, int renorm,
                                     unsigned* ids, void* weights, int keyed) {
  const i64 row = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  float v[8];
  router_probs(logits, dt, row, e, lane, v);
  unsigned taken = 0;
  float chosen = 0.0f;  // lane r holds the r-th chosen probability (the plain sum's thread r)
  for (i64 r = 0; r < k; r++) {
    float bv;
    const int bi = keyed ? warp_select_key<8>(v, e, high, lane, taken, bv)
                         : warp_select_next<8>(v, e, high, lane, taken, bv);
    if (lane == 0) {
      ids[row * k + r] = (unsigned)bi;
      stf(weights, dt, row * k + r, bv);
    }
    if (lane == r) chosen = bv;
  }
  const float w = router_weight(chosen, dt, renorm);
  if (renorm && lane < k) stf(weights, dt, row * k + lane, w);
}
