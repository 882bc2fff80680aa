// Norms, RoPE, attention over the KV cache, and the cache write.

// One block per row of D: y = x · rsqrt(mean(x²) + eps) · (w or 1 + w).
extern "C" __global__ void rms_norm(const void* x, int xdt, const void* w, int wdt, void* y, int ydt, i64 d, float eps,
                                    int unit_offset) {
  const i64 base = (i64)blockIdx.x * d;
  float ss = 0.0f;
  for (i64 j = threadIdx.x; j < d; j += blockDim.x) { float v = ldf(x, xdt, base + j); ss += v * v; }
  ss = block_sum(ss);
  float inv = rsqrtf(ss / (float)d + eps);
  for (i64 j = threadIdx.x; j < d; j += blockDim.x) {
    float g = ldf(w, wdt, j) + (unit_offset ? 1.0f : 0.0f);
    stf(y, ydt, base + j, ldf(x, xdt, base + j) * inv * g);
  }
}

extern "C" __global__ void layer_norm(const void* x, int xdt, const void* w, const void* b, int pdt, int has_w, int has_b,
                                      void* y, int ydt, i64 d, float eps) {
  const i64 base = (i64)blockIdx.x * d;
  float s = 0.0f;
  for (i64 j = threadIdx.x; j < d; j += blockDim.x) s += ldf(x, xdt, base + j);
  float mean = block_sum(s) / (float)d;
  float v = 0.0f;
  for (i64 j = threadIdx.x; j < d; j += blockDim.x) { float t = ldf(x, xdt, base + j) - mean; v += t * t; }
  float inv = rsqrtf(block_sum(v) / (float)d + eps);
  for (i64 j = threadIdx.x; j < d; j += blockDim.x) {
    float o = (ldf(x, xdt, base + j) - mean) * inv;
    if (has_w) o *= ldf(w, pdt, j);
    if (has_b) o += ldf(b, pdt, j);
    stf(y, ydt, base + j, o);
  }
}

// Channel j < dims of a head at position p, rotated: its pair (j and j + dims / 2, or 2i and
// 2i + 1 interleaved), the head's channels as load(c) gives them, turned by p · scale · freq[i].
// Unrounded.
template <class I, class Load>
__device__ __forceinline__ float rope_turned(Load load, I j, float p, const void* freq, int fdt, I dims,
                                             int interleaved, float scale) {
  const I half = dims / 2;
  const I i = interleaved ? j / 2 : (j < half ? j : j - half);
  const I ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
  float sn, cs;
  sincosf(p * scale * ldf(freq, fdt, i), &sn, &cs);
  const float a = load(ia), c = load(ib);
  return j == ia ? a * cs - c * sn : a * sn + c * cs;
}
// The same for the head at base of x (dtype dt).
template <class I>
__device__ __forceinline__ float rope_pair(const void* x, int dt, I base, I j, float p, const void* freq, int fdt,
                                           I dims, int interleaved, float scale) {
  return rope_turned<I>([&](I c) { return ldf(x, dt, base + c); }, j, p, freq, fdt, dims, interleaved, scale);
}

// The value rope() stores at element idx of x [B, H, T, D] (see rope). heads_last: x is held
// as [B, T, H, D] (the projection's layout, its transpose left to this read). I: the index
// type (unsigned where every index of the launch fits, as 64-bit divisions cost tens of
// instructions each).
template <class I = i64>
__device__ __forceinline__ float rope_value(const void* x, int dt, const void* pos, int pos_kind, int pos_batched,
                                            const void* freq, int fdt, I h, I t, I d, I dims, int interleaved,
                                            float scale, I idx, bool heads_last = false) {
  const I row = idx / d, j = idx % d;
  const I ti = row % t, bh = row / t, bi = bh / h;
  const I base = heads_last ? ((bi * t + ti) * h + bh % h) * d : row * d;
  if (j >= dims) return ldf(x, dt, base + j);
  const float p = (float)ld_index(pos, pos_kind, pos_batched ? bi * t + ti : ti);
  return rope_pair<I>(x, dt, base, j, p, freq, fdt, dims, interleaved, scale);
}

// x [B, H, T, D]; one thread per (row, pair). Channels past `dims` are copied.
extern "C" __global__ void rope(const void* x, int dt, const void* pos, int pos_kind, int pos_batched, const void* freq,
                                int fdt, void* y, i64 b, i64 h, i64 t, i64 d, i64 dims, int interleaved, float scale) {
  const i64 n = b * h * t * d;
  for (i64 idx = gid(); idx < n; idx += gstride())
    stf(y, dt, idx, rope_value(x, dt, pos, pos_kind, pos_batched, freq, fdt, h, t, d, dims, interleaved, scale, idx));
}

// kv_write(cache, rope(x)) as one kernel: the rotated keys [B, H, T, D] go straight into the
// cache [B, H, S, D] (same dtype dt) at wpos (scalar or [B]), rounded once as rope stores them.
extern "C" __global__ void rope_kv_write(const void* x, int dt, const void* pos, int pos_kind, int pos_batched,
                                         const void* freq, int fdt, i64 dims, int interleaved, float scale,
                                         void* cache, const void* wpos, int wpos_kind, int wpos_len, i64 b, i64 h,
                                         i64 s, i64 t, i64 d, int* error, int tag) {
  const i64 n = b * h * t * d;
  for (i64 idx = gid(); idx < n; idx += gstride()) {
    const i64 j = idx % d, ti = (idx / d) % t, hi = (idx / (d * t)) % h, bi = idx / (d * t * h);
    const i64 p = ld_index(wpos, wpos_kind, wpos_len == 1 ? 0 : bi);
    if (p < 0 || p + t > s) { atomicCAS(error, 0, tag); continue; }
    const float v = rope_value(x, dt, pos, pos_kind, pos_batched, freq, fdt, h, t, d, dims, interleaved, scale, idx);
    stf(cache, dt, ((bi * h + hi) * s + p + ti) * d + j, v);
  }
}

// new [B, H, T, D] into cache [B, H, S, D] at pos (scalar or [B]: token t at pos + t; or
// [B, T]: a slot a token); raw elements of `size` bytes.
extern "C" __global__ void kv_write(void* cache, const void* nw, int size, const void* pos, int pos_kind, int pos_len,
                                    i64 b, i64 h, i64 s, i64 t, i64 d, int* error, int tag) {
  const i64 n = b * h * t * d;
  const bool per_token = pos_len == b * t && t > 1;
  for (i64 idx = gid(); idx < n; idx += gstride()) {
    i64 j = idx % d, ti = (idx / d) % t, hi = (idx / (d * t)) % h, bi = idx / (d * t * h);
    const i64 base = per_token ? ld_index(pos, pos_kind, bi * t + ti) : ld_index(pos, pos_kind, pos_len == 1 ? 0 : bi);
    if (base < 0 || base + (per_token ? 1 : t) > s) { atomicCAS(error, 0, tag); continue; }
    const i64 p = per_token ? base : base + ti;
    i64 dst = ((bi * h + hi) * s + p) * d + j;
    if (size == 4) ((unsigned*)cache)[dst] = ((const unsigned*)nw)[idx];
    else ((unsigned short*)cache)[dst] = ((const unsigned short*)nw)[idx];
  }
}

// A paged pool [P, Hkv, D] (paged_attention): row b's position j at slot
// table[b · width + j / bs] · bs + j % bs, of `blocks` blocks; the attention kernels below take
// it as a template choice, so the dense caches [B, Hkv, S, D] compile as they would without it.
struct KvPages {
  const void* table;
  int kind;
  i64 width, bs, blocks;
  // The pool row (D wide) of position j of batch bi's kv head kvh; a block outside the pool
  // flags the error and reads block 0.
  __device__ __forceinline__ i64 row(i64 bi, i64 hkv, i64 kvh, i64 j, int* error, int tag) const {
    const int jb = (int)j / (int)bs;
    i64 blk = ld_index(table, kind, bi * width + jb);
    if (blk < 0 || blk >= blocks) {
      atomicCAS(error, 0, tag);
      blk = 0;
    }
    return (blk * bs + ((int)j - jb * (int)bs)) * hkv + kvh;
  }
};

// The rope and cache writes a decode attention launch does itself (fuse.rs, RopeAttention; the
// `_rope` kernels): q, k and v arrive as the projections before rope, [B, H, 1, D] each, all in
// the cache's dtype. The queries are rotated as they are loaded (rounded as rope stores them);
// the new key (rotated) and value go into the caches at wpos, written by the blocks whose split
// of the cache holds wpos before they read it (every other block reads only other positions).
// Null k: the launch took no rope (q is rotated already, the caches written).
struct RopeIn {
  const void* k;
  const void* v;
  const void* pos;
  int pos_kind, pos_batched;
  const void* freq;
  int fdt;
  i64 dims;
  int interleaved;
  float scale;
  const void* wpos;
  int wpos_kind, wpos_len;
  // Batch row bi's position (rope's, not the write's).
  __device__ __forceinline__ float position(i64 bi) const {
    return (float)ld_index(pos, pos_kind, pos_batched ? bi : 0);
  }
  // Channel j of the head at base (D channels) of x (dtype dt) at position p, rotated as rope
  // computes it and rounded to dt as rope stores it; channels past dims as they are.
  __device__ __forceinline__ float rotated(const void* x, int dt, i64 base, i64 j, float p) const {
    if (j >= dims) return ldf(x, dt, base + j);
    return round_to(rope_pair<i64>(x, dt, base, j, p, freq, fdt, dims, interleaved, scale), dt);
  }
  // Batch row bi's new key (rotated) and value of kv head kvh into the caches kc and vc
  // [B, Hkv, S, ·] (dtype dt) at its write position, by this block if its split (of `chunk`
  // positions) holds that position; a position outside the cache flags the error. Ends with a
  // block barrier, so the block then reads what it wrote.
  __device__ __forceinline__ void write(void* kc, void* vc, int dt, i64 bi, i64 hkv, i64 kvh, i64 s, i64 d, i64 dv,
                                        i64 split, i64 chunk, int* error, int tag) const {
    const i64 w = ld_index(wpos, wpos_kind, wpos_len == 1 ? 0 : bi);
    if (w < 0 || w >= s) {
      if (threadIdx.x == 0 && split == 0) atomicCAS(error, 0, tag);
    } else if (w / chunk == split) {
      const i64 src = bi * hkv + kvh, dst = src * s + w;
      const float p = position(bi);
      for (i64 c = threadIdx.x; c < d; c += blockDim.x) stf(kc, dt, dst * d + c, rotated(k, dt, src * d, c, p));
      for (i64 c = threadIdx.x; c < dv; c += blockDim.x) stf(vc, dt, dst * dv + c, ldf(v, dt, src * dv + c));
    }
    __syncthreads();
  }
};
// The rope parameters of a `_rope` attention kernel (after its own), and the RopeIn they make.
#define ROPE_PARAMS                                                                                                    \
  const void *rk, const void *rv, const void *rpos, int rpos_kind, int rpos_batched, const void *rfreq, int rfdt,      \
      i64 rdims, int rinterleaved, float rscale, const void *rwpos, int rwpos_kind, int rwpos_len
#define ROPE_IN                                                                                                        \
  RopeIn{rk, rv, rpos, rpos_kind, rpos_batched, rfreq, rfdt, rdims, rinterleaved, rscale, rwpos, rwpos_kind, rwpos_len}

// One block (128 threads) per query row (b, hq, t): scores over the valid keys, softmax, then
// the weighted sum of values. Scores live in dynamic shared memory (S floats).
template <bool PAGED>
__device__ __forceinline__ void attention_rows(const void* q, int qdt, const void* k, const void* v, int kdt,
                                               const void* kv_len, int len_kind, int len_count, void* y, int ydt,
                                               i64 hq, i64 hkv, i64 t, i64 s, i64 d, i64 dv, float scale, int causal,
                                               i64 window, float softcap, int* error, int tag, KvPages pg) {
  extern __shared__ float scores[];
  const i64 row = blockIdx.x;
  const i64 bi = row / (hq * t), hi = (row / t) % hq, ti = row % t;
  const i64 kvh = hi / (hq / hkv);
  i64 len = ld_index(kv_len, len_kind, len_count == 1 ? 0 : bi);
  if (len < t || len > s) { if (threadIdx.x == 0) atomicCAS(error, 0, tag); return; }
  const i64 p = len - t + ti;
  const i64 hi_key = causal ? p + 1 : len;
  i64 lo_key = 0;
  if (window > 0) lo_key = (p + 1 - window) > 0 ? p + 1 - window : 0;
  const i64 kbase = (bi * hkv + kvh) * s;
  auto krow = [&](i64 j) { return PAGED ? pg.row(bi, hkv, kvh, j, error, tag) : kbase + j; };
  const i64 qbase = row * d;
  float m = -INFINITY;
  for (i64 j = lo_key + threadIdx.x; j < hi_key; j += blockDim.x) {
    float acc = 0.0f;
    const i64 kr = krow(j);
    for (i64 c = 0; c < d; c++) acc += ldf(q, qdt, qbase + c) * ldf(k, kdt, kr * d + c);
    acc *= scale;
    if (softcap > 0.0f) acc = softcap * tanhf(acc / softcap);
    scores[j - lo_key] = acc;
    m = fmaxf(m, acc);
  }
  m = block_max(m);
  float sum = 0.0f;
  for (i64 j = lo_key + threadIdx.x; j < hi_key; j += blockDim.x) {
    float e = expf(scores[j - lo_key] - m);
    scores[j - lo_key] = e;
    sum += e;
  }
  sum = block_sum(sum);
  float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  for (i64 c = threadIdx.x; c < dv; c += blockDim.x) {
    float acc = 0.0f;
    for (i64 j = lo_key; j < hi_key; j++) acc += scores[j - lo_key] * ldf(v, kdt, krow(j) * dv + c);
    stf(y, ydt, row * dv + c, acc * inv);
  }
}
extern "C" __global__ void attention(const void* q, int qdt, const void* k, const void* v, int kdt, const void* kv_len,
                                     int len_kind, int len_count, void* y, int ydt, i64 hq, i64 hkv, i64 t, i64 s,
                                     i64 d, i64 dv, float scale, int causal, i64 window, float softcap, int* error,
                                     int tag) {
  attention_rows<false>(q, qdt, k, v, kdt, kv_len, len_kind, len_count, y, ydt, hq, hkv, t, s, d, dv, scale, causal,
                        window, softcap, error, tag, KvPages{});
}
// attention over a paged pool: its parameters, then the table (kind as kv_len's), its width,
// the block size and the pool's blocks; s is width · bs.
extern "C" __global__ void attention_paged(const void* q, int qdt, const void* k, const void* v, int kdt,
                                           const void* kv_len, int len_kind, int len_count, void* y, int ydt, i64 hq,
                                           i64 hkv, i64 t, i64 s, i64 d, i64 dv, float scale, int causal, i64 window,
                                           float softcap, int* error, int tag, const void* table, int table_kind,
                                           i64 width, i64 bs, i64 blocks) {
  attention_rows<true>(q, qdt, k, v, kdt, kv_len, len_kind, len_count, y, ydt, hq, hkv, t, s, d, dv, scale, causal,
                       window, softcap, error, tag, KvPages{table, table_kind, width, bs, blocks});
}

// s = a + b (rounded to sdt, stored: the residual stream) and y = rms_norm(s) in one pass; one
// block per row of D.
// RAW: every value of a row up to ARN_PER · blockDim wide requested as raw bits in one batch,
// the norm's weights with it, and converted after (ldf's conversion by a runtime dtype code
// right behind each load held the next back: session 24's SASS); `add_rms_norm_raw`, opt-in
// (MLXCEL_ARN_RAW=1), not yet measured.
template <bool RAW>
__device__ __forceinline__ void add_rms_norm_row(const void* a, const void* b, void* s, int sdt, const void* w,
                                                 int wdt, void* y, int ydt, i64 d, float eps, int unit_offset) {
  // Rows up to ARN_PER · blockDim wide stay in registers between the two passes, and every
  // load of a pass is issued before its stores (which may alias nothing, but the compiler
  // cannot know): one round trip to memory a pass instead of one an element.
  constexpr int ARN_PER = 8;
  pdl_trigger();  // the MoE router's product (a programmatic GEMV) may request its weights meanwhile
  const i64 base = (i64)blockIdx.x * d;
  const float off = unit_offset ? 1.0f : 0.0f;
  float ss = 0.0f;
  if (d <= (i64)ARN_PER * blockDim.x) {
    float va[ARN_PER], vb[ARN_PER], vw[RAW ? ARN_PER : 1];
    if (RAW) {
      unsigned ra[ARN_PER], rb[ARN_PER], rw[ARN_PER];
#pragma unroll
      for (int t = 0; t < ARN_PER; t++) {
        const i64 j = threadIdx.x + (i64)t * blockDim.x;
        ra[t] = j < d ? ld_bits(a, sdt, base + j) : 0u;
        rb[t] = j < d ? ld_bits(b, sdt, base + j) : 0u;
        rw[t] = j < d ? ld_bits(w, wdt, j) : 0u;
      }
#pragma unroll
      for (int t = 0; t < ARN_PER; t++) {
        const i64 j = threadIdx.x + (i64)t * blockDim.x;
        va[t] = j < d ? bits_float(ra[t], sdt) : 0.0f;
        vb[t] = j < d ? bits_float(rb[t], sdt) : 0.0f;
        vw[t] = j < d ? bits_float(rw[t], wdt) + off : 0.0f;
      }
    } else {
#pragma unroll
      for (int t = 0; t < ARN_PER; t++) {
        const i64 j = threadIdx.x + (i64)t * blockDim.x;
        va[t] = j < d ? ldf(a, sdt, base + j) : 0.0f;
        vb[t] = j < d ? ldf(b, sdt, base + j) : 0.0f;
      }
    }
#pragma unroll
    for (int t = 0; t < ARN_PER; t++) {
      const i64 j = threadIdx.x + (i64)t * blockDim.x;
      va[t] = round_to(va[t] + vb[t], sdt);  // the sum as stored
      if (j < d) stf(s, sdt, base + j, va[t]);
      ss += va[t] * va[t];
    }
    ss = block_sum(ss);
    const float inv = rsqrtf(ss / (float)d + eps);
#pragma unroll
    for (int t = 0; t < ARN_PER; t++) {
      const i64 j = threadIdx.x + (i64)t * blockDim.x;
      vb[t] = RAW ? vw[t] : j < d ? ldf(w, wdt, j) + off : 0.0f;
    }
#pragma unroll
    for (int t = 0; t < ARN_PER; t++) {
      const i64 j = threadIdx.x + (i64)t * blockDim.x;
      if (j < d) stf(y, ydt, base + j, va[t] * inv * vb[t]);
    }
    return;
  }
  for (i64 j = threadIdx.x; j < d; j += blockDim.x) {
    const float v = round_to(ldf(a, sdt, base + j) + ldf(b, sdt, base + j), sdt);
    stf(s, sdt, base + j, v);
    ss += v * v;
  }
  ss = block_sum(ss);
  const float inv = rsqrtf(ss / (float)d + eps);
  for (i64 j = threadIdx.x; j < d; j += blockDim.x) {
    stf(y, ydt, base + j, ldf(s, sdt, base + j) * inv * (ldf(w, wdt, j) + off));
  }
}
extern "C" __global__ void add_rms_norm(const void* a, const void* b, void* s, int sdt, const void* w, int wdt, void* y,
                                        int ydt, i64 d, float eps, int unit_offset) {
  add_rms_norm_row<false>(a, b, s, sdt, w, wdt, y, ydt, d, eps, unit_offset);
}
extern "C" __global__ void add_rms_norm_raw(const void* a, const void* b, void* s, int sdt, const void* w, int wdt,
                                            void* y, int ydt, i64 d, float eps, int unit_offset) {
  add_rms_norm_row<true>(a, b, s, sdt, w, wdt, y, ydt, d, eps, unit_offset);
}

// Rows [row0, row0 + nrows) of y [rows, dv] (nrows at most the block's warps) from their
// `splits` partials each (max, sum, unnormalized output; attention_split's part): a row a warp,
// or blockDim / 32 / nrows warps a row splitting its channels. Each warp finds its row's max and
// sum over the splits itself (lanes over splits, shuffles: no block barrier, two rounds of
// loads in all), then each channel sums the splits' outputs with their weights, loads
// independent of one another. Partials are read through L2 (other blocks of the same launch
// wrote them where the split kernel merges them itself). At most 256 splits (launch.rs caps
// them), blocks of at most 4 warps.
__device__ __forceinline__ void combine_rows(const float* part, i64 splits, i64 dv, void* y, int ydt, i64 row0,
                                             i64 nrows) {
  __shared__ float wsplit[4][256];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int per = (int)((blockDim.x >> 5) / nrows), r = warp / per, sub = warp % per;
  if (r >= nrows) return;
  const float* p = part + (row0 + r) * splits * (dv + 2);
  float m[8], l[8], mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < 8; i++) {
    const i64 sp = lane + 32 * i;
    m[i] = sp < splits ? __ldcg(p + sp * (dv + 2)) : -INFINITY;
    l[i] = sp < splits ? __ldcg(p + sp * (dv + 2) + 1) : 0.0f;
  }
#pragma unroll
  for (int i = 0; i < 8; i++) mx = fmaxf(mx, m[i]);
  mx = warp_max(mx);
  float tot = 0.0f;
  float* ws = wsplit[warp];
#pragma unroll
  for (int i = 0; i < 8; i++) {
    const i64 sp = lane + 32 * i;
    const float w = m[i] == -INFINITY ? 0.0f : expf(m[i] - mx);
    tot += w == 0.0f ? 0.0f : l[i] * w;
    if (sp < splits) ws[sp] = w;
  }
  tot = warp_sum(tot);
  __syncwarp();
  const float inv = tot > 0.0f ? 1.0f / tot : 0.0f;
  for (i64 c = sub * 32 + lane; c < dv; c += 32 * per) {
    float o = 0.0f;
#pragma unroll 8
    for (i64 sp = 0; sp < splits; sp++) o += __ldcg(p + sp * (dv + 2) + 2 + c) * ws[sp];
    stf(y, ydt, (row0 + r) * dv + c, o * inv);
  }
}

// y [rows, dv] from the partials of attention_split: one block per row.
extern "C" __global__ void attention_combine(const float* part, i64 splits, i64 dv, void* y, int ydt) {
  pdl_trigger();  // the output product (a programmatic GEMV) may request its weights meanwhile
  combine_rows(part, splits, dv, y, ydt, blockIdx.x, 1);
}

// The merge of a split kernel's partials without a second launch: every block of group `grp`
// (a row, or a kv head's rows [row0, row0 + nrows)) counts itself done in ticket[grp] once its
// partials are visible; the last of the group's `splits` blocks resets the count for the next
// launch and combines the group's rows into y. ticket null: attention_combine merges them.
__device__ __forceinline__ void splits_done(const float* part, int* ticket, i64 grp, i64 row0, i64 nrows, i64 splits,
                                            i64 dv, void* y, int ydt) {
  if (!ticket) return;
  __shared__ int last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(ticket + grp, 1) == splits - 1;
    if (last) ticket[grp] = 0;
  }
  __syncthreads();
  if (!last) return;
  pdl_trigger();
  __threadfence();
  combine_rows(part, splits, dv, y, ydt, row0, nrows);
}

// Decode attention split over the cache (flash-decoding), for one query position per (batch,
// head): block (row, split) of 128 threads takes keys [split·chunk, split·chunk + chunk) within
// the valid range, each warp an interleaved share with a running max and sum, and writes its
// partial (max, sum, unnormalized output) to part [rows, splits, dv + 2]; the last block of a
// row to finish merges them (splits_done), or attention_combine does where the launch passes no
// tickets. The length is read from device memory, so the grid is fixed for replay.
#define ATT_MAXD 256
// KV: the cache's storage type, so its loads are plain typed loads that issue together (see
// attention_split_kv for the dispatch on kdt).
template <bool PAGED, class KV>
__device__ __forceinline__ void attention_split_rows(const void* q, int qdt, const void* k, const void* v, int kdt,
                                                     const void* kv_len, int len_kind, int len_count, float* part,
                                                     i64 hq, i64 hkv, i64 s, i64 d, i64 dv, float scale, int causal,
                                                     i64 window, float softcap, i64 chunk, int* error, int tag,
                                                     KvPages pg, const RopeIn& rp) {
  typedef typename KV::T T;
  __shared__ float wm[4], wl[4], wacc[4][ATT_MAXD];
  const i64 row = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
  const i64 bi = row / hq, hi = row % hq, kvh = hi / (hq / hkv);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* out = part + (row * splits + split) * (dv + 2);
  if (rp.k) rp.write((void*)k, (void*)v, kdt, bi, hkv, kvh, s, d, dv, split, chunk, error, tag);
  const i64 len = ld_index(kv_len, len_kind, len_count == 1 ? 0 : bi);
  if (len < 1 || len > s) {
    if (threadIdx.x == 0 && split == 0) atomicCAS(error, 0, tag);
    if (threadIdx.x == 0) { out[0] = -INFINITY; out[1] = 0.0f; }
    for (i64 c = threadIdx.x; c < dv; c += blockDim.x) out[2 + c] = 0.0f;
    return;
  }
  const i64 p = len - 1;
  const i64 hi_key = causal ? p + 1 : len;
  const i64 lo_key = window > 0 && p + 1 - window > 0 ? p + 1 - window : 0;
  const i64 j0 = split * chunk > lo_key ? split * chunk : lo_key;
  const i64 j1 = (split + 1) * chunk < hi_key ? (split + 1) * chunk : hi_key;
  const i64 kbase = (bi * hkv + kvh) * s;
  auto krow = [&](i64 j) { return PAGED ? pg.row(bi, hkv, kvh, j, error, tag) : kbase + j; };
  float qv[ATT_MAXD / 32], acc[ATT_MAXD / 32];
  const float qpos = rp.k ? rp.position(bi) : 0.0f;
#pragma unroll
  for (int i = 0; i < ATT_MAXD / 32; i++) {
    const i64 c = lane + 32 * i;
    qv[i] = c >= d ? 0.0f : rp.k ? rp.rotated(q, qdt, row * d, c, qpos) : ldf(q, qdt, row * d + c);
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (i64 j = j0 + warp; j < j1; j += 4) {
    float dot = 0.0f, vv[ATT_MAXD / 32];
    const i64 kr = krow(j);
    const T* kt = (const T*)k;
    const T* vt = (const T*)v;
#pragma unroll
    for (int i = 0; i < ATT_MAXD / 32; i++) {  // the key and its value requested together
      const i64 c = lane + 32 * i;
      if (c < d) dot += qv[i] * KV::ld(kt, kr * d + c);
      vv[i] = c < dv ? KV::ld(vt, kr * dv + c) : 0.0f;
    }
    float sc = warp_sum(dot) * scale;
    if (softcap > 0.0f) sc = softcap * tanhf(sc / softcap);
    const float mn = fmaxf(m, sc);
    const float corr = expf(m - mn), e = expf(sc - mn);
    l = l * corr + e;
#pragma unroll
    for (int i = 0; i < ATT_MAXD / 32; i++) {
      const i64 c = lane + 32 * i;
      if (c < dv) acc[i] = acc[i] * corr + e * vv[i];
    }
    m = mn;
  }
  if (lane == 0) { wm[warp] = m; wl[warp] = l; }
#pragma unroll
  for (int i = 0; i < ATT_MAXD / 32; i++) {
    const i64 c = lane + 32 * i;
    if (c < dv) wacc[warp][c] = acc[i];
  }
  __syncthreads();
  float mx = fmaxf(fmaxf(wm[0], wm[1]), fmaxf(wm[2], wm[3]));
  if (threadIdx.x == 0) {
    float tot = 0.0f;
    for (int w = 0; w < 4; w++) tot += wm[w] == -INFINITY ? 0.0f : wl[w] * expf(wm[w] - mx);
    out[0] = mx;
    out[1] = tot;
  }
  for (i64 c = threadIdx.x; c < dv; c += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < 4; w++) o += wm[w] == -INFINITY ? 0.0f : wacc[w][c] * expf(wm[w] - mx);
    out[2 + c] = o;
  }
}
template <bool PAGED>
__device__ __forceinline__ void attention_split_kv(const void* q, int qdt, const void* k, const void* v, int kdt,
                                                   const void* kv_len, int len_kind, int len_count, float* part,
                                                   i64 hq, i64 hkv, i64 s, i64 d, i64 dv, float scale, int causal,
                                                   i64 window, float softcap, i64 chunk, int* error, int tag,
                                                   KvPages pg, const RopeIn& rp = RopeIn{}) {
#define SPLIT_ROWS(KV)                                                                                                 \
  attention_split_rows<PAGED, KV>(q, qdt, k, v, kdt, kv_len, len_kind, len_count, part, hq, hkv, s, d, dv, scale,     \
                                  causal, window, softcap, chunk, error, tag, pg, rp)
  if (kdt == 0) SPLIT_ROWS(F32);
  else if (kdt == 1) SPLIT_ROWS(F16);
  else SPLIT_ROWS(BF16);
#undef SPLIT_ROWS
}
// The split kernels' parameters after part: ticket, y and ydt (see splits_done).
extern "C" __global__ void attention_split(const void* q, int qdt, const void* k, const void* v, int kdt,
                                           const void* kv_len, int len_kind, int len_count, float* part, int* ticket,
                                           void* y, int ydt, i64 hq, i64 hkv, i64 s, i64 d, i64 dv, float scale,
                                           int causal, i64 window, float softcap, i64 chunk, int* error, int tag) {
  attention_split_kv<false>(q, qdt, k, v, kdt, kv_len, len_kind, len_count, part, hq, hkv, s, d, dv, scale, causal,
                            window, softcap, chunk, error, tag, KvPages{});
  splits_done(part, ticket, blockIdx.x, blockIdx.x, 1, gridDim.y, dv, y, ydt);
}
// attention_split with the queries' rope and the cache writes of its new key and value (see
// RopeIn): its parameters, then ROPE_PARAMS.
extern "C" __global__ void attention_split_rope(const void* q, int qdt, const void* k, const void* v, int kdt,
                                                const void* kv_len, int len_kind, int len_count, float* part,
                                                int* ticket, void* y, int ydt, i64 hq, i64 hkv, i64 s, i64 d, i64 dv,
                                                float scale, int causal, i64 window, float softcap, i64 chunk,
                                                int* error, int tag, ROPE_PARAMS) {
  attention_split_kv<false>(q, qdt, k, v, kdt, kv_len, len_kind, len_count, part, hq, hkv, s, d, dv, scale, causal,
                            window, softcap, chunk, error, tag, KvPages{}, ROPE_IN);
  splits_done(part, ticket, blockIdx.x, blockIdx.x, 1, gridDim.y, dv, y, ydt);
}
// attention_split over a paged pool: its parameters, then the table, its width, the block
// size and the pool's blocks (s is width · bs); the same for attention_gqa_paged_*.
extern "C" __global__ void attention_split_paged(const void* q, int qdt, const void* k, const void* v, int kdt,
                                                 const void* kv_len, int len_kind, int len_count, float* part,
                                                 int* ticket, void* y, int ydt, i64 hq, i64 hkv, i64 s, i64 d, i64 dv,
                                                 float scale, int causal, i64 window, float softcap, i64 chunk,
                                                 int* error, int tag, const void* table, int table_kind, i64 width,
                                                 i64 bs, i64 blocks) {
  attention_split_kv<true>(q, qdt, k, v, kdt, kv_len, len_kind, len_count, part, hq, hkv, s, d, dv, scale, causal,
                           window, softcap, chunk, error, tag, KvPages{table, table_kind, width, bs, blocks});
  splits_done(part, ticket, blockIdx.x, blockIdx.x, 1, gridDim.y, dv, y, ydt);
}

// E consecutive elements (E = 2, 4 or 8) of dtype dt from element i of p (16-byte aligned runs
// for E = 8), as f32, with one vector load, in two halves: the raw words (E of them hold the
// run in any dtype), then the floats. Callers load several runs before converting any (ld_runs),
// so their loads are in flight together: a conversion right after each load made each wait for
// the one before.
template <int E> __device__ __forceinline__ void ld_run_bits(const void* p, int dt, i64 i, unsigned* r) {
  if (dt == 0) {
    const unsigned* f = (const unsigned*)p + i;
    if (E == 2) { const uint2 v = *(const uint2*)f; r[0] = v.x; r[1] = v.y; return; }
#pragma unroll
    for (int e = 0; e < E; e += 4) {
      const uint4 v = *(const uint4*)(f + e);
      r[e] = v.x; r[e + 1] = v.y; r[e + 2] = v.z; r[e + 3] = v.w;
    }
    return;
  }
  const unsigned short* h = (const unsigned short*)p + i;
  if (E == 2) r[0] = *(const unsigned*)h;
  else if (E == 4) { const uint2 v = *(const uint2*)h; r[0] = v.x; r[1] = v.y; }
  else { const uint4 v = *(const uint4*)h; r[0] = v.x; r[1] = v.y; r[2] = v.z; r[3] = v.w; }
}
template <int E> __device__ __forceinline__ void run_floats(const unsigned* r, int dt, float* o) {
  if (dt == 0) {
#pragma unroll
    for (int e = 0; e < E; e++) o[e] = __uint_as_float(r[e]);
    return;
  }
#pragma unroll
  for (int e = 0; e < E / 2; e++) {
    o[2 * e] = bits_float(r[e] & 0xffffu, dt);
    o[2 * e + 1] = bits_float(r[e] >> 16, dt);
  }
}
// U runs at elements at[u] (zeros where !live[u]): every load issued before any conversion.
template <int E, int U>
__device__ __forceinline__ void ld_runs(const void* p, int dt, const i64* at, const bool* live, float (*o)[E]) {
  unsigned r[U][E];
#pragma unroll
  for (int u = 0; u < U; u++)
    if (live[u]) ld_run_bits<E>(p, dt, at[u], r[u]);
#pragma unroll
  for (int u = 0; u < U; u++) {
    if (live[u]) run_floats<E>(r[u], dt, o[u]);
    else
#pragma unroll
      for (int e = 0; e < E; e++) o[u][e] = 0.0f;
  }
}

// The keys [j0, j0 + n) split `split` (of `chunk` keys) of batch row bi sees in a cache of s
// positions: the one query sits at the last position, so causal or not it sees [lo, len),
// lo the window's start. A length outside [1, s] flags the error (the row's first split) and
// sees none.
__device__ __forceinline__ void gqa_keys(const void* kv_len, int len_kind, int len_count, i64 bi, i64 s, i64 window,
                                         i64 split, i64 chunk, int* error, int tag, i64* j0, i64* n) {
  const i64 len = ld_index(kv_len, len_kind, len_count == 1 ? 0 : bi);
  *j0 = 0;
  *n = 0;
  if (len < 1 || len > s) {
    if (threadIdx.x == 0 && split == 0) atomicCAS(error, 0, tag);  // every row's blocks may see it
    return;
  }
  const i64 lo_key = window > 0 && len - window > 0 ? len - window : 0;
  *j0 = split * chunk > lo_key ? split * chunk : lo_key;
  const i64 j1 = (split + 1) * chunk < len ? (split + 1) * chunk : len;
  *n = j1 > *j0 ? j1 - *j0 : 0;
}

// This lane's E channels of the group's g query heads from row row0 on (zeros past g).
template <int E, int GM>
__device__ __forceinline__ void gqa_queries(const void* q, int qdt, i64 row0, i64 g, int lane, float (*qv)[E]) {
  i64 at[GM];
  bool live[GM];
#pragma unroll
  for (int h = 0; h < GM; h++) at[h] = (row0 + h) * 32 * E + lane * E, live[h] = h < g;
  ld_runs<E, GM>(q, qdt, at, live, qv);
}

// A head's score for one key, its channels E a lane: the dot product summed over the warp,
// scaled, softcapped where asked (every lane gets it).
template <int E>
__device__ __forceinline__ float gqa_score(const float* qv, const float* kf, float scale, float softcap) {
  float d = 0.0f;
#pragma unroll
  for (int e = 0; e < E; e++) d += qv[e] * kf[e];
  d = warp_sum(d) * scale;
  return softcap > 0.0f ? softcap * tanhf(d / softcap) : d;
}

// Decode attention split over the cache for grouped queries: block (b · hkv + kv head, split)
// takes the G = hq / hkv query heads that share a kv head (up to GM = 4) over keys
// [split·chunk, split·chunk + chunk) of the valid range, so each key and value is read once
// for the group. Head size D = 32 · E (128 or 256 as launched), a lane holding E channels.
// Four warps share the keys: first the scores of every head (kept in shared memory), then each
// head's max and exponentials, then the weighted values, summed over the warps. Writes
// attention_split's partials (max, sum, unnormalized output) per query row, merged as
// attention_split's are; the parameters are attention_split's (its head sizes unused).
template <int E, bool PAGED>
__device__ __forceinline__ void attention_gqa(const void* q, int qdt, const void* k, const void* v, int kdt,
                                              const void* kv_len, int len_kind, int len_count, float* part,
                                              i64 hq, i64 hkv, i64 s, float scale, int causal, i64 window,
                                              float softcap, i64 chunk, int* error, int tag, KvPages pg,
                                              const RopeIn& rp = RopeIn{}) {
  (void)causal;
  constexpr int D = 32 * E, GM = 4;  // launch.rs sizes the shared memory for these
  extern __shared__ float att_sm[];
  float* sc = att_sm;                  // [GM][chunk] scores, then exponentials
  float* red = att_sm + GM * chunk;    // [4][GM][D] per-warp outputs
  float* ml = red + 4 * GM * D;        // [2][GM] max and sum of each head
  const i64 grp = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
  const i64 bi = grp / hkv, kvh = grp % hkv, g = hq / hkv;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const i64 row0 = bi * hq + kvh * g;  // query row of the group's first head
  if (rp.k) rp.write((void*)k, (void*)v, kdt, bi, hkv, kvh, s, D, D, split, chunk, error, tag);
  i64 j0, n;
  gqa_keys(kv_len, len_kind, len_count, bi, s, window, split, chunk, error, tag, &j0, &n);
  float qv[GM][E];
  if (rp.k) {  // each channel's rotation computed once for the group's heads
    const float p = rp.position(bi);
#pragma unroll
    for (int h = 0; h < GM; h++)
#pragma unroll
      for (int e = 0; e < E; e++) qv[h][e] = h < g ? rp.rotated(q, qdt, (row0 + h) * D, lane * E + e, p) : 0.0f;
  } else {
    gqa_queries<E, GM>(q, qdt, row0, g, lane, qv);
  }
  const i64 kbase = (bi * hkv + kvh) * s + j0;
  auto krow = [&](i64 jj) { return PAGED ? pg.row(bi, hkv, kvh, j0 + jj, error, tag) : kbase + jj; };
  constexpr int U = 4;  // keys a warp has in flight
  for (i64 jj = warp; jj < n; jj += 4 * U) {
    float kf[U][E];
    i64 at[U];
    bool live[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      live[u] = jj + 4 * u < n;
      at[u] = live[u] ? krow(jj + 4 * u) * D + lane * E : 0;
    }
    ld_runs<E, U>(k, kdt, at, live, kf);
#pragma unroll
    for (int u = 0; u < U; u++) {
#pragma unroll
      for (int h = 0; h < GM; h++) {
        if (h >= g) continue;
        const float d = gqa_score<E>(qv[h], kf[u], scale, softcap);
        if (lane == 0 && jj + 4 * u < n) sc[h * chunk + jj + 4 * u] = d;
      }
    }
  }
  __syncthreads();
  for (int h = warp; h < g; h += 4) {
    float m = -INFINITY;
    for (i64 j = lane; j < n; j += 32) m = fmaxf(m, sc[h * chunk + j]);
    m = warp_max(m);
    float l = 0.0f;
    for (i64 j = lane; j < n; j += 32) {
      const float e = expf(sc[h * chunk + j] - m);
      sc[h * chunk + j] = e;
      l += e;
    }
    l = warp_sum(l);
    if (lane == 0) { ml[h] = m; ml[GM + h] = l; }
  }
  __syncthreads();
  float acc[GM][E];
#pragma unroll
  for (int h = 0; h < GM; h++)
#pragma unroll
    for (int e = 0; e < E; e++) acc[h][e] = 0.0f;
  for (i64 jj = warp; jj < n; jj += 4 * U) {
    float vf[U][E];
    i64 at[U];
    bool live[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      live[u] = jj + 4 * u < n;
      at[u] = live[u] ? krow(jj + 4 * u) * D + lane * E : 0;
    }
    ld_runs<E, U>(v, kdt, at, live, vf);
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (jj + 4 * u >= n) continue;
#pragma unroll
      for (int h = 0; h < GM; h++) {
        if (h >= g) continue;
        const float p = sc[h * chunk + jj + 4 * u];
#pragma unroll
        for (int e = 0; e < E; e++) acc[h][e] += p * vf[u][e];
      }
    }
  }
#pragma unroll
  for (int h = 0; h < GM; h++) {
    if (h >= g) continue;
#pragma unroll
    for (int e = 0; e < E; e++) red[(warp * GM + h) * D + lane * E + e] = acc[h][e];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < g * D; idx += blockDim.x) {
    const int h = idx / D, c = idx % D;
    float* out = part + ((row0 + h) * splits + split) * (D + 2);
    out[2 + c] = red[h * D + c] + red[(GM + h) * D + c] + red[(2 * GM + h) * D + c] + red[(3 * GM + h) * D + c];
    if (c == 0) {
      out[0] = n > 0 ? ml[h] : -INFINITY;
      out[1] = n > 0 ? ml[GM + h] : 0.0f;
    }
  }
}
// splits_done for the grouped kernels: block (b · hkv + kv head, split) merges its group's rows.
template <int E>
__device__ __forceinline__ void gqa_splits_done(const float* part, int* ticket, i64 hq, i64 hkv, void* y, int ydt) {
  const i64 grp = blockIdx.x, g = hq / hkv;
  splits_done(part, ticket, grp, grp / hkv * hq + grp % hkv * g, g, gridDim.y, 32 * E, y, ydt);
}
#define ATTENTION_GQA(E)                                                                                               \
  extern "C" __global__ void attention_gqa_##E(                                                                        \
      const void* q, int qdt, const void* k, const void* v, int kdt, const void* kv_len, int len_kind, int len_count,  \
      float* part, int* ticket, void* y, int ydt, i64 hq, i64 hkv, i64 s, i64, i64, float scale,                       \
      int causal, i64 window, float softcap, i64 chunk,                                                                \
      int* error, int tag) {                                                                                           \
    attention_gqa<E, false>(q, qdt, k, v, kdt, kv_len, len_kind, len_count, part, hq, hkv, s, scale, causal, window, \
                            softcap, chunk, error, tag, KvPages{});                                                    \
    gqa_splits_done<E>(part, ticket, hq, hkv, y, ydt);                                                                 \
  }                                                                                                                    \
  extern "C" __global__ void attention_gqa_paged_##E(                                                                  \
      const void* q, int qdt, const void* k, const void* v, int kdt, const void* kv_len, int len_kind, int len_count,  \
      float* part, int* ticket, void* y, int ydt, i64 hq, i64 hkv, i64 s, i64, i64, float scale,                       \
      int causal, i64 window, float softcap, i64 chunk,                                                                \
      int* error, int tag, const void* table, int table_kind, i64 width, i64 bs, i64 blocks) {                         \
    attention_gqa<E, true>(q, qdt, k, v, kdt, kv_len, len_kind, len_count, part, hq, hkv, s, scale, causal, window,   \
                           softcap, chunk, error, tag, KvPages{table, table_kind, width, bs, blocks});                 \
    gqa_splits_done<E>(part, ticket, hq, hkv, y, ydt);                                                                 \
  }
ATTENTION_GQA(4)
ATTENTION_GQA(8)
// attention_gqa with the queries' rope and the cache writes of the new key and value (RopeIn).
#define ATTENTION_GQA_ROPE(E)                                                                                          \
  extern "C" __global__ void attention_gqa_rope_##E(                                                                   \
      const void* q, int qdt, const void* k, const void* v, int kdt, const void* kv_len, int len_kind, int len_count,  \
      float* part, int* ticket, void* y, int ydt, i64 hq, i64 hkv, i64 s, i64, i64, float scale, int causal,           \
      i64 window, float softcap, i64 chunk, int* error, int tag, ROPE_PARAMS) {                                        \
    attention_gqa<E, false>(q, qdt, k, v, kdt, kv_len, len_kind, len_count, part, hq, hkv, s, scale, causal, window, \
                            softcap, chunk, error, tag, KvPages{}, ROPE_IN);                                           \
    gqa_splits_done<E>(part, ticket, hq, hkv, y, ydt);                                                                 \
  }
ATTENTION_GQA_ROPE(4)
ATTENTION_GQA_ROPE(8)

// attention_gqa with one round of loads per U keys: each warp takes U consecutive keys at a time
// and requests their keys and values together, and keeps an online softmax per head (running
// max m, sum l, and the output rescaled whenever m grows), so values need no second pass
// after the scores. The four warps' (output, m, l) are merged in shared memory, [4][GM][D + 2]
// floats; the partials written are attention_split's, as attention_gqa writes them.
// MLXCEL_ATT_ONLINE=1 takes it (not yet the default: unmeasured).
template <int E, bool PAGED>
__device__ __forceinline__ void attention_gqa_online(const void* q, int qdt, const void* k, const void* v, int kdt,
                                                     const void* kv_len, int len_kind, int len_count, float* part,
                                                     i64 hq, i64 hkv, i64 s, float scale, i64 window, float softcap,
                                                     i64 chunk, int* error, int tag, KvPages pg) {
  constexpr int D = 32 * E, GM = 4, U = E == 8 ? 4 : 8;
  extern __shared__ float att_sm[];
  const i64 grp = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
  const i64 bi = grp / hkv, kvh = grp % hkv, g = hq / hkv;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const i64 row0 = bi * hq + kvh * g;
  i64 j0, n;
  gqa_keys(kv_len, len_kind, len_count, bi, s, window, split, chunk, error, tag, &j0, &n);
  float qv[GM][E], m[GM], l[GM], acc[GM][E];
  gqa_queries<E, GM>(q, qdt, row0, g, lane, qv);
#pragma unroll
  for (int h = 0; h < GM; h++) {
    m[h] = -INFINITY;
    l[h] = 0.0f;
#pragma unroll
    for (int e = 0; e < E; e++) acc[h][e] = 0.0f;
  }
  const i64 kbase = (bi * hkv + kvh) * s + j0;
  auto krow = [&](i64 jj) { return PAGED ? pg.row(bi, hkv, kvh, j0 + jj, error, tag) : kbase + jj; };
  for (i64 jj = warp * U; jj < n; jj += 4 * U) {
    float kf[U][E], vf[U][E];
    i64 at[U];
    bool live[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      live[u] = jj + u < n;
      at[u] = live[u] ? krow(jj + u) * D + lane * E : 0;
    }
    unsigned kr[U][E], vr[U][E];  // keys and values requested together, then converted
#pragma unroll
    for (int u = 0; u < U; u++)
      if (live[u]) ld_run_bits<E>(k, kdt, at[u], kr[u]), ld_run_bits<E>(v, kdt, at[u], vr[u]);
#pragma unroll
    for (int u = 0; u < U; u++)
      if (live[u]) run_floats<E>(kr[u], kdt, kf[u]), run_floats<E>(vr[u], kdt, vf[u]);
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (jj + u >= n) break;  // uniform across the warp
#pragma unroll
      for (int h = 0; h < GM; h++) {
        if (h >= g) continue;
        const float d = gqa_score<E>(qv[h], kf[u], scale, softcap);
        const float mn = fmaxf(m[h], d), corr = expf(m[h] - mn), p = expf(d - mn);
        l[h] = l[h] * corr + p;
#pragma unroll
        for (int e = 0; e < E; e++) acc[h][e] = acc[h][e] * corr + p * vf[u][e];
        m[h] = mn;
      }
    }
  }
  float* red = att_sm;  // [4][GM][D + 2]
#pragma unroll
  for (int h = 0; h < GM; h++) {
    if (h >= g) continue;
    float* w = red + (warp * GM + h) * (D + 2);
#pragma unroll
    for (int e = 0; e < E; e++) w[lane * E + e] = acc[h][e];
    if (lane == 0) { w[D] = m[h]; w[D + 1] = l[h]; }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < g * D; idx += blockDim.x) {
    const int h = idx / D, c = idx % D;
    float mx = -INFINITY;
    for (int w = 0; w < 4; w++) mx = fmaxf(mx, red[(w * GM + h) * (D + 2) + D]);
    float o = 0.0f, tot = 0.0f;
    if (mx != -INFINITY) {
      for (int w = 0; w < 4; w++) {
        const float* r = red + (w * GM + h) * (D + 2);
        const float f = expf(r[D] - mx);  // 0 for a warp without keys (its max is -inf)
        o += r[c] * f;
        tot += r[D + 1] * f;
      }
    }
    float* out = part + ((row0 + h) * splits + split) * (D + 2);
    out[2 + c] = o;
    if (c == 0) {
      out[0] = mx;
      out[1] = tot;
    }
  }
}
#define ATTENTION_GQA_ONLINE(E)                                                                                        \
  extern "C" __global__ void attention_gqa_online_##E(                                                                 \
      const void* q, int qdt, const void* k, const void* v, int kdt, const void* kv_len, int len_kind, int len_count,  \
      float* part, int* ticket, void* y, int ydt, i64 hq, i64 hkv, i64 s, i64, i64, float scale,                       \
      int, i64 window, float softcap, i64 chunk,                                                                       \
      int* error, int tag) {                                                                                           \
    attention_gqa_online<E, false>(q, qdt, k, v, kdt, kv_len, len_kind, len_count, part, hq, hkv, s, scale, window,  \
                                   softcap, chunk, error, tag, KvPages{});                                             \
    gqa_splits_done<E>(part, ticket, hq, hkv, y, ydt);                                                                 \
  }                                                                                                                    \
  extern "C" __global__ void attention_gqa_online_paged_##E(                                                           \
      const void* q, int qdt, const void* k, const void* v, int kdt, const void* kv_len, int len_kind, int len_count,  \
      float* part, int* ticket, void* y, int ydt, i64 hq, i64 hkv, i64 s, i64, i64, float scale,                       \
      int, i64 window, float softcap, i64 chunk,                                                                       \
      int* error, int tag, const void* table, int table_kind, i64 width, i64 bs, i64 blocks) {                         \
    attention_gqa_online<E, true>(q, qdt, k, v, kdt, kv_len, len_kind, len_count, part, hq, hkv, s, scale, window,   \
                                  softcap, chunk, error, tag, KvPages{table, table_kind, width, bs, blocks});          \
    gqa_splits_done<E>(part, ticket, hq, hkv, y, ydt);                                                                 \
  }
ATTENTION_GQA_ONLINE(4)
ATTENTION_GQA_ONLINE(8)

// The key and the value of cache row kr, a lane's 8 channels from c0 (two 16-byte loads).
template <class T, int D>
__device__ __forceinline__ void lanes_load(const void* k, const void* v, i64 kr, int c0, unsigned* kw, unsigned* vw) {
  const uint4 a = *(const uint4*)((const T*)k + kr * D + c0), b = *(const uint4*)((const T*)v + kr * D + c0);
  kw[0] = a.x, kw[1] = a.y, kw[2] = a.z, kw[3] = a.w;
  vw[0] = b.x, vw[1] = b.y, vw[2] = b.z, vw[3] = b.w;
}

// Decode attention a query head a block (or G heads of one kv head) with several keys in flight
// a warp (attention_split's grid, parameters and partials; MLXCEL_ATT_LANES=0 goes back to it).
// attention_split takes a key a warp at a time, so each warp waits a round trip a key. Here LPK
// lanes take a key, 8 channels a lane (one 16-byte load of the key and one of its value), so a
// warp holds 32 / LPK keys, and each such slot takes U keys at a time with every load issued
// before any is used. Each slot keeps an online softmax (running max m, sum l, and its channels'
// output rescaled as m grows) for each of the block's G query heads, which share every key and
// value loaded; the block's 4 · 32 / LPK slots merge in shared memory. Block x takes query rows
// G·x .. G·x + G - 1 (G divides the group, so they share the batch row and kv head). Heads of
// D = 8 · LPK channels for q, k and v alike; 16-bit caches (KV), 16-byte aligned rows.
// EARLY (not PAGED; a programmatic launch after the launch that writes q and the newest key and
// value): the first round's keys and values but the newest row's are requested before waiting
// for it.
template <int LPK, int U, int G, bool PAGED, class KV, bool EARLY = false>
__device__ __forceinline__ void attention_lanes_rows(const void* q, int qdt, const void* k, const void* v,
                                                     const void* kv_len, int len_kind, int len_count, float* part,
                                                     i64 hq, i64 hkv, i64 s, float scale, int causal, i64 window,
                                                     float softcap, i64 chunk, int* error, int tag, KvPages pg,
                                                     const RopeIn& rp) {
  constexpr int D = 8 * LPK, KPW = 32 / LPK, SLOTS = 4 * KPW;
  typedef typename KV::T T;
  __shared__ float wm[G][SLOTS], wl[G][SLOTS], wf[G][SLOTS], wacc[G][SLOTS][D];
  const i64 row0 = blockIdx.x * G, split = blockIdx.y, splits = gridDim.y;
  const i64 bi = row0 / hq, hi = row0 % hq, kvh = hi / (hq / hkv);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int c0 = (lane % LPK) * 8, slot = warp * KPW + lane / LPK;
  if (rp.k) rp.write((void*)k, (void*)v, KV::DT, bi, hkv, kvh, s, D, D, split, chunk, error, tag);
  // Causal or not, the one query sees [lo, len) (gqa_keys); a bad length flags the error and
  // sees no key, so the partial written below is the empty one (max -inf, sum 0).
  (void)causal;
  i64 j0, n;
  gqa_keys(kv_len, len_kind, len_count, bi, s, window, split, chunk, error, tag, &j0, &n);
  const i64 j1 = j0 + n;
  const i64 kbase = (bi * hkv + kvh) * s;
  unsigned ekw[EARLY ? U : 1][4], evw[EARLY ? U : 1][4];  // EARLY: the first round's
  if (EARLY) {
    // The newest row (the length's last) is the kernel ahead's: requested after waiting.
    const i64 newest = ld_index(kv_len, len_kind, len_count == 1 ? 0 : bi) - 1;
#pragma unroll
    for (int u = 0; u < U; u++) {
      const i64 j = j0 + u * SLOTS + slot;
      if (j < j1 && j != newest) lanes_load<T, D>(k, v, kbase + j, c0, ekw[u], evw[u]);
    }
    pdl_wait();
#pragma unroll
    for (int u = 0; u < U; u++) {
      const i64 j = j0 + u * SLOTS + slot;
      if (j < j1 && j == newest) lanes_load<T, D>(k, v, kbase + j, c0, ekw[u], evw[u]);
    }
  }
  float qv[G][8], acc[G][8], m[G], l[G];
  const float qpos = rp.k ? rp.position(bi) : 0.0f;
#pragma unroll
  for (int h = 0; h < G; h++) {
    m[h] = -INFINITY, l[h] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; e++) {
      const i64 at = (row0 + h) * D;
      qv[h][e] = rp.k ? rp.rotated(q, qdt, at, c0 + e, qpos) : ldf(q, qdt, at + c0 + e);
      acc[h][e] = 0.0f;
    }
  }
  // The trip count is the same in every lane, so the shuffles below see the whole warp.
  for (i64 jb = j0; jb < j1; jb += SLOTS * U) {
    unsigned kw[U][4], vw[U][4];
    bool live[U];
#pragma unroll
    for (int u = 0; u < U; u++) {  // every key and value of the round requested together
      const i64 j = jb + u * SLOTS + slot;
      live[u] = j < j1;
      if (EARLY && live[u] && jb == j0) {
#pragma unroll
        for (int i = 0; i < 4; i++) kw[u][i] = ekw[u][i], vw[u][i] = evw[u][i];
      } else if (live[u]) {
        lanes_load<T, D>(k, v, PAGED ? pg.row(bi, hkv, kvh, j, error, tag) : kbase + j, c0, kw[u], vw[u]);
      } else {
#pragma unroll
        for (int i = 0; i < 4; i++) kw[u][i] = vw[u][i] = 0u;
      }
    }
    float sc[G][U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      float kf[8];
      run_floats<8>(kw[u], KV::DT, kf);
#pragma unroll
      for (int h = 0; h < G; h++) {
        sc[h][u] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) sc[h][u] += qv[h][e] * kf[e];
      }
    }
#pragma unroll
    for (int o = LPK / 2; o > 0; o >>= 1)
#pragma unroll
      for (int h = 0; h < G; h++)
#pragma unroll
        for (int u = 0; u < U; u++) sc[h][u] += __shfl_xor_sync(0xffffffffu, sc[h][u], o);
    // No key of this slot in the round (keys grow with u; no shuffles follow). A NaN score is
    // not skipped: fmaxf would drop it from the max, and it must reach the output as
    // attention_split lets it.
    if (!live[0]) continue;
    float p[G][U];
#pragma unroll
    for (int h = 0; h < G; h++) {
      float mn = m[h];
#pragma unroll
      for (int u = 0; u < U; u++) {
        sc[h][u] *= scale;
        if (softcap > 0.0f) sc[h][u] = softcap * tanhf(sc[h][u] / softcap);
        if (!live[u]) sc[h][u] = -INFINITY;
        mn = fmaxf(mn, sc[h][u]);
      }
      const float corr = expf(m[h] - mn);  // 0 while m is -inf
      l[h] *= corr;
#pragma unroll
      for (int e = 0; e < 8; e++) acc[h][e] *= corr;
#pragma unroll
      for (int u = 0; u < U; u++) {
        p[h][u] = expf(sc[h][u] - mn);  // 0 for a key past the range
        l[h] += p[h][u];
      }
      m[h] = mn;
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      float vf[8];
      run_floats<8>(vw[u], KV::DT, vf);
#pragma unroll
      for (int h = 0; h < G; h++)
#pragma unroll
        for (int e = 0; e < 8; e++) acc[h][e] += p[h][u] * vf[e];
    }
  }
#pragma unroll
  for (int h = 0; h < G; h++) {
    if (c0 == 0) { wm[h][slot] = m[h]; wl[h][slot] = l[h]; }
#pragma unroll
    for (int e = 0; e < 8; e++) wacc[h][slot][c0 + e] = acc[h][e];
  }
  __syncthreads();
  if (threadIdx.x < G * SLOTS) {
    const int h = threadIdx.x / SLOTS, i = threadIdx.x % SLOTS;
    float mx = -INFINITY;
#pragma unroll
    for (int r = 0; r < SLOTS; r++) mx = fmaxf(mx, wm[h][r]);
    wf[h][i] = wm[h][i] == -INFINITY ? 0.0f : expf(wm[h][i] - mx);
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < G; h++) {
    float* out = part + ((row0 + h) * splits + split) * (D + 2);
    if (threadIdx.x == 0) {
      float mx = -INFINITY, tot = 0.0f;
#pragma unroll
      for (int i = 0; i < SLOTS; i++) mx = fmaxf(mx, wm[h][i]), tot += wl[h][i] * wf[h][i];
      out[0] = mx;
      out[1] = tot;
    }
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
      float o = 0.0f;
#pragma unroll
      for (int i = 0; i < SLOTS; i++) o += wacc[h][i][c] * wf[h][i];
      out[2 + c] = o;
    }
  }
}
template <int LPK, int G, bool PAGED, bool EARLY = false>
__device__ __forceinline__ void attention_lanes(const void* q, int qdt, const void* k, const void* v, int kdt,
                                                const void* kv_len, int len_kind, int len_count, float* part, i64 hq,
                                                i64 hkv, i64 s, float scale, int causal, i64 window, float softcap,
                                                i64 chunk, int* error, int tag, KvPages pg,
                                                const RopeIn& rp = RopeIn{}) {
  // Keys a slot has in flight; a warp's (32 / LPK slots): 16, 8, 8 and 4 for D = 32, 64, 128, 256
  // a head, half that (128 and 256 channels) where a block takes several heads, whose scores
  // and outputs take the registers.
  constexpr int U = LPK <= 8 ? 2 : G > 1 ? 2 : 4;
  if (kdt == 1)
    attention_lanes_rows<LPK, U, G, PAGED, F16, EARLY>(q, qdt, k, v, kv_len, len_kind, len_count, part, hq, hkv, s,
                                                       scale, causal, window, softcap, chunk, error, tag, pg, rp);
  else
    attention_lanes_rows<LPK, U, G, PAGED, BF16, EARLY>(q, qdt, k, v, kv_len, len_kind, len_count, part, hq, hkv, s,
                                                        scale, causal, window, softcap, chunk, error, tag, pg, rp);
}
// attention_lanes{SFX}_{D} and attention_lanes_paged{SFX}_{D}, G query heads a block (SFX ""
// for 1, "_g4" for 4): attention_split's and attention_split_paged's parameters (d and dv
// unused: both D).
#define ATTENTION_LANES_DENSE_PAGED(D, G, SFX)                                                                         \
  extern "C" __global__ void attention_lanes##SFX##_##D(                                                               \
      const void* q, int qdt, const void* k, const void* v, int kdt, const void* kv_len, int len_kind, int len_count,  \
      float* part, int* ticket, void* y, int ydt, i64 hq, i64 hkv, i64 s, i64, i64, float scale, int causal,           \
      i64 window, float softcap, i64 chunk, int* error, int tag) {                                                     \
    attention_lanes<D / 8, G, false>(q, qdt, k, v, kdt, kv_len, len_kind, len_count, part, hq, hkv, s, scale, causal, \
                                     window, softcap, chunk, error, tag, KvPages{});                                   \
    splits_done(part, ticket, blockIdx.x, blockIdx.x * G, G, gridDim.y, D, y, ydt);                                    \
  }                                                                                                                    \
  extern "C" __global__ void attention_lanes_paged##SFX##_##D(                                                         \
      const void* q, int qdt, const void* k, const void* v, int kdt, const void* kv_len, int len_kind, int len_count,  \
      float* part, int* ticket, void* y, int ydt, i64 hq, i64 hkv, i64 s, i64, i64, float scale, int causal,           \
      i64 window, float softcap, i64 chunk, int* error, int tag, const void* table, int table_kind, i64 width, i64 bs, \
      i64 blocks) {                                                                                                    \
    attention_lanes<D / 8, G, true>(q, qdt, k, v, kdt, kv_len, len_kind, len_count, part, hq, hkv, s, scale, causal,  \
                                    window, softcap, chunk, error, tag, KvPages{table, table_kind, width, bs, blocks}); \
    splits_done(part, ticket, blockIdx.x, blockIdx.x * G, G, gridDim.y, D, y, ydt);                                    \
  }
// Those at 1 and 4 heads a block, attention_lanes_early_{D} (a head a block, a programmatic
// launch: EARLY; bounded to five blocks an SM, which its first round's registers would
// otherwise cut to four), and attention_lanes_rope_{D} (attention_split_rope's parameters), a
// head a block.
#define ATTENTION_LANES(D)                                                                                             \
  ATTENTION_LANES_DENSE_PAGED(D, 1, )                                                                                  \
  ATTENTION_LANES_DENSE_PAGED(D, 4, _g4)                                                                               \
  extern "C" __global__ void __launch_bounds__(128, 5) attention_lanes_early_##D(                                      \
      const void* q, int qdt, const void* k, const void* v, int kdt, const void* kv_len, int len_kind, int len_count,  \
      float* part, int* ticket, void* y, int ydt, i64 hq, i64 hkv, i64 s, i64, i64, float scale, int causal,           \
      i64 window, float softcap, i64 chunk, int* error, int tag) {                                                     \
    attention_lanes<D / 8, 1, false, true>(q, qdt, k, v, kdt, kv_len, len_kind, len_count, part, hq, hkv, s, scale,   \
                                           causal, window, softcap, chunk, error, tag, KvPages{});                     \
    splits_done(part, ticket, blockIdx.x, blockIdx.x, 1, gridDim.y, D, y, ydt);                                        \
  }                                                                                                                    \
  extern "C" __global__ void attention_lanes_rope_##D(                                                                 \
      const void* q, int qdt, const void* k, const void* v, int kdt, const void* kv_len, int len_kind, int len_count,  \
      float* part, int* ticket, void* y, int ydt, i64 hq, i64 hkv, i64 s, i64, i64, float scale, int causal,           \
      i64 window, float softcap, i64 chunk, int* error, int tag, ROPE_PARAMS) {                                        \
    attention_lanes<D / 8, 1, false>(q, qdt, k, v, kdt, kv_len, len_kind, len_count, part, hq, hkv, s, scale, causal, \
                                     window, softcap, chunk, error, tag, KvPages{}, ROPE_IN);                          \
    splits_done(part, ticket, blockIdx.x, blockIdx.x, 1, gridDim.y, D, y, ydt);                                        \
  }
ATTENTION_LANES(32)
ATTENTION_LANES(64)
ATTENTION_LANES(128)
ATTENTION_LANES(256)

// A decode layer's three small kernels before attention as one launch: rope of q [B, Hq, T, D]
// into q_out (as rope), rope of k [B, H, T, D] into its cache (as rope_kv_write) and v
// [B, H, T, Dv] into its cache (as kv_write), all in dtype dt; q and k share positions and
// frequencies, both caches [B, H, S, ·] the write position wpos. heads_last: q, k and v are
// held as [B, T, H, ·] (a prefill's projections; the transposes to [B, H, T, ·] are this read).
template <class I>
__device__ __forceinline__ void rope_qkv(const void* q, void* q_out, I hq, const void* k, void* kcache, const void* v,
                                         void* vcache, I dv, int dt, const void* pos, int pos_kind, int pos_batched,
                                         const void* freq, int fdt, I dims, int interleaved, float scale,
                                         const void* wpos, int wpos_kind, int wpos_len, I b, I h, I s, I t, I d,
                                         int* error, int tag, bool heads_last) {
  const I nq = b * hq * t * d, nk = b * h * t * d, nv = b * h * t * dv;
  for (i64 at = gid(); at < (i64)(nq + nk + nv); at += gstride()) {
    const I idx = (I)at;
    if (idx < nq) {
      const float r = rope_value<I>(q, dt, pos, pos_kind, pos_batched, freq, fdt, hq, t, d, dims, interleaved, scale,
                                    idx, heads_last);
      stf(q_out, dt, idx, r);
      continue;
    }
    const bool is_v = idx >= nq + nk;
    const I e = is_v ? idx - nq - nk : idx - nq, w = is_v ? dv : d;
    const I j = e % w, r = e / w, ti = r % t, bh = r / t, hi = bh % h, bi = bh / h;
    const i64 p = ld_index(wpos, wpos_kind, wpos_len == 1 ? 0 : bi);
    if (p < 0 || p + (i64)t > (i64)s) { atomicCAS(error, 0, tag); continue; }
    const I dst = ((bi * h + hi) * s + (I)p + ti) * w + j;
    if (!is_v) {
      stf(kcache, dt, dst,
          rope_value<I>(k, dt, pos, pos_kind, pos_batched, freq, fdt, h, t, d, dims, interleaved, scale, e, heads_last));
      continue;
    }
    const I src = heads_last ? ((bi * t + ti) * h + hi) * dv + j : e;
    if (dt == 0) ((unsigned*)vcache)[dst] = ((const unsigned*)v)[src];
    else ((unsigned short*)vcache)[dst] = ((const unsigned short*)v)[src];
  }
}
extern "C" __global__ void rope_qkv_write(const void* q, void* q_out, i64 hq, const void* k, void* kcache,
                                          const void* v, void* vcache, i64 dv, int dt, const void* pos, int pos_kind,
                                          int pos_batched, const void* freq, int fdt, i64 dims, int interleaved,
                                          float scale, const void* wpos, int wpos_kind, int wpos_len, i64 b, i64 h,
                                          i64 s, i64 t, i64 d, int* error, int tag, int heads_last) {
  // Every index (q, k and v together, or a cache element) in 32 bits, or the 64-bit path.
  const i64 heads = hq > h ? hq : h, width = d > dv ? d : dv, len = s > t ? s : t;
  if (b * heads * len * width < (1ll << 30))
    rope_qkv<unsigned>(q, q_out, hq, k, kcache, v, vcache, dv, dt, pos, pos_kind, pos_batched, freq, fdt, dims,
                       interleaved, scale, wpos, wpos_kind, wpos_len, b, h, s, t, d, error, tag, heads_last);
  else
    rope_qkv<i64>(q, q_out, hq, k, kcache, v, vcache, dv, dt, pos, pos_kind, pos_batched, freq, fdt, dims, interleaved,
                  scale, wpos, wpos_kind, wpos_len, b, h, s, t, d, error, tag, heads_last);
}

// A head row of d channels in row (shared memory, one warp's; the values as stored), RMSNorm'd
// in place: ss the lane's share of the sum of squares (its channels lane, lane + 32, ..., added
// in that order), each channel x · inv · w (w + 1 with unit_offset) rounded to dt as rms_norm
// stores it. Ends with the warp synchronized.
__device__ __forceinline__ void norm_head_row(float* row, float ss, i64 d, float eps, const void* w, int wdt,
                                              int unit_offset, int dt) {
  const float inv = rsqrtf(warp_sum(ss) / (float)d + eps);
  for (i64 j = threadIdx.x & 31; j < d; j += 32)
    row[j] = round_to(row[j] * inv * (ldf(w, wdt, j) + (unit_offset ? 1.0f : 0.0f)), dt);
  __syncwarp();
}

// rope_qkv_write with each query and key head's RMSNorm first (Qwen3's and Gemma 3's q_norm and
// k_norm over D): q and k arrive before their norms as [B, T, H, D] (at one position that is
// also [B, H, T, D]); v as rope_qkv_write reads it (heads_last). A warp a head row: its sum of
// squares in f32, each channel x · inv · w (w + 1 with unit_offset) rounded to dt as rms_norm
// stores it, kept in shared memory for the rotation (rope's values, rope's rounding), then
// written to q_out [B, Hq, T, D] or the key cache; a warp a row of v copies it into its cache.
// Blocks of 256 threads (8 warps), D at most 256.
#define QKN_WARPS 8
extern "C" __global__ void __launch_bounds__(256) rope_qkv_norm_write(
    const void* q, void* q_out, i64 hq, const void* k, void* kcache, const void* v, void* vcache, i64 dv, int dt,
    const void* pos, int pos_kind, int pos_batched, const void* freq, int fdt, i64 dims, int interleaved, float scale,
    const void* wpos, int wpos_kind, int wpos_len, i64 b, i64 h, i64 s, i64 t, i64 d, int* error, int tag,
    int heads_last, const void* qw, const void* kw, int wdt, float qeps, float keps, int unit_offset) {
  __shared__ float normed[QKN_WARPS][256];
  const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
  float* row = normed[wi];
  const i64 qrows = b * t * hq, krows = b * t * h, rows = qrows + 2 * krows;
  for (i64 r = (i64)blockIdx.x * QKN_WARPS + wi; r < rows; r += (i64)gridDim.x * QKN_WARPS) {
    const bool is_q = r < qrows, is_v = r >= qrows + krows;
    const i64 rr = is_q ? r : is_v ? r - qrows - krows : r - qrows, heads = is_q ? hq : h;
    const i64 hi = rr % heads, bt = rr / heads, ti = bt % t, bi = bt / t;  // rr is (bi, ti, hi)
    i64 at = 0;
    if (!is_q) {
      const i64 p = ld_index(wpos, wpos_kind, wpos_len == 1 ? 0 : bi);
      if (p < 0 || p + t > s) {  // the same for every lane
        if (lane == 0) atomicCAS(error, 0, tag);
        continue;
      }
      at = (bi * h + hi) * s + p + ti;  // the row of the cache
    }
    if (is_v) {
      const i64 src = heads_last ? rr * dv : ((bi * h + hi) * t + ti) * dv;
      for (i64 j = lane; j < dv; j += 32) {
        if (dt == 0) ((unsigned*)vcache)[at * dv + j] = ((const unsigned*)v)[src + j];
        else ((unsigned short*)vcache)[at * dv + j] = ((const unsigned short*)v)[src + j];
      }
      continue;
    }
    const void* x = is_q ? q : k;
    float ss = 0.0f;
    for (i64 j = lane; j < d; j += 32) {
      const float e = ldf(x, dt, rr * d + j);
      row[j] = e;
      ss += e * e;
    }
    norm_head_row(row, ss, d, is_q ? qeps : keps, is_q ? qw : kw, wdt, unit_offset, dt);
    const float p = (float)ld_index(pos, pos_kind, pos_batched ? bi * t + ti : ti);
    const i64 out = is_q ? ((bi * hq + hi) * t + ti) * d : at * d;
    for (i64 j = lane; j < d; j += 32) {
      const float o = j < dims ? rope_turned<i64>([&](i64 c) { return row[c]; }, j, p, freq, fdt, dims, interleaved, scale)
                               : row[j];
      stf(is_q ? q_out : kcache, dt, out + j, o);
    }
    __syncwarp();  // the row's readers are done before the next row is written
  }
}

// An attention layer's q, k and v products at one decode position of batch 1 (tc_qgemv3's three
// 4-bit products and parameters, each n a multiple of 16) with its rope and cache writes
// (rope_qkv_write's) in the epilogue, so the rope-and-write is no launch: q turned into y0 (the
// rope's output [Hq, D]), k turned into the key cache y1 [Hkv, S, D] and v copied into the
// value cache y2 [Hkv, S, Dv] at row wpos. Every channel of a head turns (the rope's dims = D,
// a multiple of 16). A turned product's tile holds whole pairs: not interleaved, rows
// h·D + 8i .. 8i + 7 with their partners D / 2 further (tc_qdot's bstride), so thread j < 8 of
// the block holds a row and thread j + 8 its partner; interleaved, rows 2m and 2m + 1 of a plain
// tile (threads j and j ^ 1). Each product is rounded to its dtype (with its bias, if any)
// before it turns, as the unfused rope reads it; positions, frequencies and rounding as rope's.
// A write position outside the cache flags the error and writes neither cache.
// With per-head norms (qw non-null; Qwen3's and Gemma 3's q_norm and k_norm, D at most 256),
// a tile's rows go where the head's turned values will (the queries' buffer, the key cache)
// as the products are stored, and the block that completes a head (a ticket a q and k head in
// `tickets`, left at zero) normalizes it there as rope_qkv_norm_write does, then turns it.
// x, which the compiler cannot see through: a value worked out anew from it is not merged with
// one worked out before (and so kept live in between).
__device__ __forceinline__ i64 opaque(i64 x) {
  asm volatile("mov.b64 %0, %0;" : "+l"(x));
  return x;
}
// The store of one channel by the epilogue of q, k and v's products with their rope and cache
// writes (tc_qgemv3_rope, tc_qgemv3_nrope, dsk_gemv3_rope): row `row` of product `part` (0: q,
// into y0 [Hq, D]; 1: k, into the key cache y1 [Hkv, S, D]; 2: v, into the value cache y2
// [Hkv, S, Dv]; the caches at position p, only where placed), its value v and, for q and k, its
// rope partner's u, turned as rope turns them.
__device__ __forceinline__ void store_turned(int part, i64 row, float v, float u, void* y0, void* y1, void* y2, int ydt,
                                             i64 d, i64 dv, i64 s, i64 p, bool placed, const void* pos, int pos_kind,
                                             const void* freq, int fdt, int interleaved, float scale) {
  if (part == 2) {
    if (placed) stf(y2, ydt, (row / dv * s + p) * dv + row % dv, v);
    return;
  }
  const i64 c = row % d, half = d / 2;
  const bool first = interleaved ? (c & 1) == 0 : c < half;
  float sn, cs;
  sincosf((float)ld_index(pos, pos_kind, 0) * scale * ldf(freq, fdt, interleaved ? c / 2 : first ? c : c - half), &sn,
          &cs);
  const float r = first ? v * cs - u * sn : u * sn + v * cs;
  if (part == 0) stf(y0, ydt, row, r);
  else if (placed) stf(y1, ydt, (row / d * s + p) * d + c, r);
}
// Where tile `tile` of tc_qgemv3_rope lies: its product (part), its first row there (row0) and
// the distance from a lane's row a to its row b (tc_qdot's bstride).
__device__ __forceinline__ void rope_tile(i64 tile, i64 n0, i64 n1, i64 d, int interleaved, int* part, i64* row0,
                                          i64* stride) {
  i64 r = tile * 16;
  *part = r >= n0 + n1 ? 2 : r >= n0 ? 1 : 0;
  r -= *part == 2 ? n0 + n1 : *part == 1 ? n0 : 0;
  *stride = 8;
  if (*part < 2 && !interleaved) {
    const unsigned per = (unsigned)d / 16, t = (unsigned)(r / 16);
    r = (i64)(t / per) * d + t % per * 8, *stride = d / 2;
  }
  *row0 = r;
}
// tc_qgemv3_rope's epilogue with per-head norms, in its first warp: lane c < 16 stores its
// row's product v (rounded, biased) as channel c of q's head or k's (part 0 or 1), in the
// queries' buffer y0 or the key cache y1 at position p (where placed); the block that counts
// the head's last tile normalizes the head there (through shared memory `head`) and turns it.
__device__ __forceinline__ void norm_rope_head(int part, i64 row0, i64 c, float v, void* y0, void* y1, int ydt, i64 n0,
                                               i64 d, i64 s, i64 p, bool placed, const void* pos, int pos_kind,
                                               const void* freq, int fdt, int interleaved, float scale,
                                               const void* qw, const void* kw, int wdt, float qeps, float keps,
                                               int unit_offset, int* tickets, float* head) {
  const int lane = threadIdx.x & 31;
  const i64 hd = row0 / d;
  void* dst = part == 0 ? y0 : y1;
  const i64 base = part == 0 ? hd * d : (hd * s + p) * d;
  if (lane < 16 && (part == 0 || placed)) stf(dst, ydt, base + c, v);
  __threadfence();
  __syncwarp();
  int last = 0;
  if (lane == 0) {
    int* ticket = tickets + (part == 0 ? 0 : n0 / d) + hd;
    last = atomicAdd(ticket, 1) == (int)(d / 16) - 1;
    if (last) *ticket = 0;
  }
  if (!__shfl_sync(0xffffffffu, last, 0) || (part == 1 && !placed)) return;
  __threadfence();
  float ss = 0.0f;
  for (i64 j = lane; j < d; j += 32) {
    const float e = ldf_cg(dst, ydt, base + j);
    head[j] = e;
    ss += e * e;
  }
  norm_head_row(head, ss, d, part == 0 ? qeps : keps, part == 0 ? qw : kw, wdt, unit_offset, ydt);
  const float pr = (float)ld_index(pos, pos_kind, 0);
  for (i64 j = lane; j < d; j += 32)
    stf(dst, ydt, base + j, rope_turned<i64>([&](i64 i) { return head[i]; }, j, pr, freq, fdt, d, interleaved, scale));
  __syncwarp();  // the head's readers are done before the block's next head is written
}
// The parameters of tc_qgemv3_rope and tc_qgemv3_nrope: tc_qgemv3's, the rope's and the
// writes', then the per-head norms' (null qw without) and their tickets.
#define TC_QGEMV3_ROPE_PARAMS                                                                                         \
  const void *x, const unsigned *w0, const void *s0, const void *z0, void *y0, i64 n0, const unsigned *w1,            \
      const void *s1, const void *z1, void *y1, i64 n1, const unsigned *w2, const void *s2, const void *z2, void *y2, \
      i64 n2, int sdt, int ydt, i64 k, int group, NORM_IN_PARAMS, const void *b0, const void *b1, const void *b2,     \
      const void *pos, int pos_kind, const void *freq, int fdt, i64 d, i64 dv, int interleaved, float scale,          \
      const void *wpos, int wpos_kind, i64 s, int *error, int tag, const void *qw, const void *kw, int wdt,           \
      float qeps, float keps, int unit_offset, int *tickets
// Inside those kernels: the products of tile `tile` (x staged where `stage`), thread i < 16's
// sum into sums[i] through shared memory: the epilogue works the tile out anew, so nothing of
// it lives in registers across the products.
#define TC_ROPE_TILE_PRODUCTS(X, stage, DB)                                                                           \
  {                                                                                                                   \
    int part;                                                                                                         \
    i64 row0, stride;                                                                                                 \
    rope_tile(tile, n0, n1, d, interleaved, &part, &row0, &stride);                                                   \
    const unsigned* w = part == 2 ? w2 : part == 1 ? w1 : w0;                                                         \
    const void* sc = part == 2 ? s2 : part == 1 ? s1 : s0;                                                            \
    const void* z = part == 2 ? z2 : part == 1 ? z1 : z0;                                                             \
    float out[1] = {0.0f};                                                                                            \
    tc_qdot<X, 1, DB>(x, NORM_IN, stage, &w, &sc, &z, sdt, row0, part == 2 ? n2 : part == 1 ? n1 : n0, k, group, out, \
                      stride);                                                                                        \
    if (threadIdx.x < 16) sums[threadIdx.x] = out[0];                                                                 \
  }
#define TC_QGEMV3_ROPE(XN, X, SUF, CAP, DB)                                                                           \
  extern "C" __global__ void CAP tc_qgemv3_rope_##XN##_4##SUF(                                                        \
      TC_QGEMV3_ROPE_PARAMS) {                                                                                        \
    __shared__ float sums[16], head[256];                                                                             \
    const i64 tiles = (n0 + n1 + n2) / 16;                                                                            \
    /* DB: a block a tile (launched with grid = tiles), no loop to keep state across */                               \
    for (int tile = blockIdx.x, first = 1; tile < (int)tiles && (!DB || first); tile += gridDim.x, first = 0) {       \
      TC_ROPE_TILE_PRODUCTS(X, tile == blockIdx.x, DB);                                                               \
      if (threadIdx.x >= 32) continue;                                                                                \
      __syncwarp();                                                                                                   \
      int part;                                                                                                       \
      i64 row0, stride;                                                                                               \
      /* (opaque: else ptxas keeps the first place, spilling it, rather than work it out anew) */                     \
      rope_tile(opaque(tile), n0, n1, d, interleaved, &part, &row0, &stride);                                         \
      const void* b = part == 2 ? b2 : part == 1 ? b1 : b0;                                                           \
      /* Read here, after tc_qdot waited for the kernel ahead (a programmatic launch). */                            \
      const i64 p = ld_index(wpos, wpos_kind, 0);                                                                     \
      const bool placed = p >= 0 && p < s;                                                                            \
      if (!placed && tile == 0 && threadIdx.x == 0) atomicCAS(error, 0, tag);                                         \
      const int j = threadIdx.x & 15;                                                                                 \
      const i64 row = row0 + (j < 8 ? j : stride + j - 8);                                                            \
      const float v = round_to(with_bias(sums[j], b, ydt, row), ydt);                                                 \
      if (qw && part < 2) {                                                                                           \
        norm_rope_head(part, row0, row % d, v, y0, y1, ydt, n0, d, s, p, placed, pos, pos_kind, freq, fdt,            \
                       interleaved, scale, qw, kw, wdt, qeps, keps, unit_offset, tickets, head);                      \
        continue;                                                                                                     \
      }                                                                                                               \
      const float u = __shfl_xor_sync(0xffffffffu, v, interleaved ? 1 : 8);                                           \
      if (threadIdx.x < 16)                                                                                           \
        store_turned(part, row, v, u, y0, y1, y2, ydt, d, dv, s, p, placed, pos, pos_kind, freq, fdt, interleaved,    \
                     scale);                                                                                          \
    }                                                                                                                 \
  }
TC_QGEMV3_ROPE(f16, F16, , TC_GEMV_CAP, false)
TC_QGEMV3_ROPE(bf16, BF16, , TC_GEMV_CAP, false)
TC_QGEMV3_ROPE(f16, F16, _r0, , false)
TC_QGEMV3_ROPE(bf16, BF16, _r0, , false)
// Two chunks of a warp's weights in flight (tc_qdot's DB; launch.rs tc_double), at most 256
// threads a block and three such blocks an SM (80 registers: unbounded it takes 91, two blocks).
#define TC_DB_CAP __launch_bounds__(256, 3)
TC_QGEMV3_ROPE(f16, F16, _db, TC_DB_CAP, true)
TC_QGEMV3_ROPE(bf16, BF16, _db, TC_DB_CAP, true)

// Thread-block clusters (sm_90): a barrier of every thread of the cluster (release and acquire:
// shared memory written before it is seen after it), and a float of block `rank`'s shared memory
// at the address of p in this block's.
__device__ __forceinline__ void cluster_sync() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ float ld_cluster(const float* p, unsigned rank) {
  float v = 0.0f;
#if __CUDA_ARCH__ >= 900
  unsigned a;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"((unsigned)__cvta_generic_to_shared(p)), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(a) : "memory");
#endif
  return v;
}

// tc_qgemv3_rope with per-head q and k norms, a head's tiles in one thread-block cluster: launched
// with a block a tile (tc_qgemv3_rope's tiles and pairs) and clusters of D / 16 blocks (at most
// 16; past 8 a non-portable size, launch.rs), so cluster c holds head c's tiles (the v tiles'
// clusters only write). Each block of a q or k head puts its 16 rounded products' sum of squares
// in shared memory; after a cluster barrier every block of the head adds the head's sums in
// rank order (the same in each), normalizes its rows as rms_norm stores them (x · inv · w,
// w + 1 with unit_offset), turns them with their partners and writes them; a second barrier
// keeps each block's sums until all have read them. No ticket and no second trip to memory
// (tc_qgemv3_rope's with `tickets`).
#define TC_QGEMV3_NORM_ROPE(XN, X, SUF, CAP, DB)                                                                      \
  extern "C" __global__ void CAP tc_qgemv3_nrope_##XN##_4##SUF(                                                       \
      TC_QGEMV3_ROPE_PARAMS) {                                                                                        \
    __shared__ float sums[16], tile_ss;                                                                               \
    const int tile = blockIdx.x;                                                                                      \
    TC_ROPE_TILE_PRODUCTS(X, true, DB);                                                                               \
    int part;                                                                                                         \
    i64 row0, stride;                                                                                                 \
    rope_tile(opaque(tile), n0, n1, d, interleaved, &part, &row0, &stride);                                           \
    const int j = threadIdx.x & 15;                                                                                   \
    const i64 row = row0 + (j < 8 ? j : stride + j - 8);                                                              \
    float v = 0.0f;                                                                                                   \
    __syncthreads();                                                                                                  \
    if (threadIdx.x < 32) {                                                                                           \
      v = round_to(with_bias(sums[j], part == 2 ? b2 : part == 1 ? b1 : b0, ydt, row), ydt);                          \
      float sq = v * v;                                                                                               \
      for (int o = 8; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);                                     \
      if (threadIdx.x == 0) tile_ss = sq;                                                                             \
    }                                                                                                                 \
    cluster_sync();                                                                                                   \
    if (threadIdx.x < 32) {                                                                                           \
      /* Read here, after tc_qdot waited for the kernel ahead (a programmatic launch). */                            \
      const i64 p = ld_index(wpos, wpos_kind, 0);                                                                     \
      const bool placed = p >= 0 && p < s;                                                                            \
      if (!placed && tile == 0 && threadIdx.x == 0) atomicCAS(error, 0, tag);                                         \
      if (part < 2) {                                                                                                 \
        float total = 0.0f;                                                                                           \
        for (unsigned r = 0; r < (unsigned)(d / 16); r++) total += ld_cluster(&tile_ss, r);                           \
        const float inv = rsqrtf(total / (float)d + (part == 0 ? qeps : keps));                                       \
        v = round_to(v * inv * (ldf(part == 0 ? qw : kw, wdt, row % d) + (unit_offset ? 1.0f : 0.0f)), ydt);          \
      }                                                                                                               \
      const float u = __shfl_xor_sync(0xffffffffu, v, interleaved ? 1 : 8);                                           \
      if (threadIdx.x < 16)                                                                                           \
        store_turned(part, row, v, u, y0, y1, y2, ydt, d, dv, s, p, placed, pos, pos_kind, freq, fdt, interleaved,    \
                     scale);                                                                                          \
    }                                                                                                                 \
    cluster_sync(); /* the cluster's sums stay until every block has read them */                                    \
  }
TC_QGEMV3_NORM_ROPE(f16, F16, , TC_GEMV_CAP, false)
TC_QGEMV3_NORM_ROPE(bf16, BF16, , TC_GEMV_CAP, false)
TC_QGEMV3_NORM_ROPE(f16, F16, _r0, , false)
TC_QGEMV3_NORM_ROPE(bf16, BF16, _r0, , false)
TC_QGEMV3_NORM_ROPE(f16, F16, _db, TC_DB_CAP, true)
TC_QGEMV3_NORM_ROPE(bf16, BF16, _db, TC_DB_CAP, true)

// dsk_gemv3's three dense products of one row (q, k and v; its parameters and meaning) with
// tc_qgemv3_rope's rope and cache writes in the epilogue (its parameters after dsk_gemv3's).
// A block's sets of a turned product are whole pairs: sets 2m and 2m + 1 take rows
// h·D + i and h·D + i + D / 2 (not interleaved) or rows 2i and 2i + 1 (interleaved), so a set
// finds its partner's sum in the block's shared memory. Needs two sets a block at least (G at
// most 4); every part's rows a multiple of the sets (D a multiple of 16).
template <class X, class W>
__device__ __forceinline__ void dsk_gemv3_rope(const void* x, const void* w0, void* y0, i64 n0, const void* w1,
                                               void* y1, i64 n1, const void* w2, void* y2, i64 n2, int ydt, i64 k,
                                               int G, const NormIn& nin, const void* b0, const void* b1,
                                               const void* b2, const void* pos, int pos_kind, const void* freq,
                                               int fdt, i64 d, i64 dv, int interleaved, float scale,
                                               const void* wpos, int wpos_kind, i64 s, int* error, int tag) {
  __shared__ float sums[DSK_WARPS][1];
  const int sets = DSK_WARPS / G;
  // Set `set`'s part, matrix, bias and row within its matrix (n: that matrix's rows).
  auto locate = [&](int set, int* part, const void** w, const void** b, i64* row, i64* n) {
    i64 r = (i64)blockIdx.x * sets + set;
    *part = r >= n0 + n1 ? 2 : r >= n0 ? 1 : 0;
    r -= *part == 2 ? n0 + n1 : *part == 1 ? n0 : 0;
    *w = *part == 2 ? w2 : *part == 1 ? w1 : w0;
    *b = *part == 2 ? b2 : *part == 1 ? b1 : b0;
    *n = *part == 2 ? n2 : *part == 1 ? n1 : n0;
    if (*part < 2 && !interleaved) {
      const i64 pair = r / 2, half = d / 2;
      r = pair / half * d + pair % half + (r % 2) * half;
    }
    *row = r;
  };
  int part;
  const void *w, *b;
  i64 row, n;
  locate((threadIdx.x >> 5) / G, &part, &w, &b, &row, &n);
  dsk_sums<X, W, 1>(x, nin, w, w, row, n, k, G, sums);
  if (threadIdx.x >= sets) return;
  const i64 p = ld_index(wpos, wpos_kind, 0);
  const bool placed = p >= 0 && p < s;
  if (!placed && blockIdx.x == 0 && threadIdx.x == 0) atomicCAS(error, 0, tag);
  const int me = threadIdx.x;
  locate(me, &part, &w, &b, &row, &n);
  const float v = round_to(with_bias(sums[me][0], b, ydt, row), ydt);
  float u = 0.0f;
  if (part < 2) {  // the partner is in the same product
    i64 other;
    locate(me ^ 1, &part, &w, &b, &other, &n);
    u = round_to(with_bias(sums[me ^ 1][0], b, ydt, other), ydt);
  }
  store_turned(part, row, v, u, y0, y1, y2, ydt, d, dv, s, p, placed, pos, pos_kind, freq, fdt, interleaved, scale);
}
#define DSK_ROPE(XN, X, WN, W)                                                                                        \
  extern "C" __global__ void dsk_gemv3_rope_##XN##_##WN(                                                              \
      const void* x, const void* w0, void* y0, i64 n0, const void* w1, void* y1, i64 n1, const void* w2, void* y2,    \
      i64 n2, int ydt, i64 k, int g, NORM_IN_PARAMS, const void* b0, const void* b1, const void* b2, const void* pos,  \
      int pos_kind, const void* freq, int fdt, i64 d, i64 dv, int interleaved, float scale, const void* wpos,         \
      int wpos_kind, i64 s, int* error, int tag) {                                                                    \
    dsk_gemv3_rope<X, W>(x, w0, y0, n0, w1, y1, n1, w2, y2, n2, ydt, k, g, NORM_IN, b0, b1, b2, pos, pos_kind, freq,  \
                         fdt, d, dv, interleaved, scale, wpos, wpos_kind, s, error, tag);                             \
  }
DSK_ROPE(f16, F16, f16, F16)
DSK_ROPE(f16, F16, bf16, BF16)
DSK_ROPE(bf16, BF16, f16, F16)
DSK_ROPE(bf16, BF16, bf16, BF16)
