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

// x [B, H, T, D]; one thread per (row, pair). Channels past `dims` are copied.
extern "C" __global__ void rope(const void* x, int dt, const void* pos, int pos_kind, int pos_batched, const void* freq,
                                int fdt, void* y, i64 b, i64 h, i64 t, i64 d, i64 dims, int interleaved, float scale) {
  const i64 half = dims / 2, rows = b * h * t;
  for (i64 idx = gid(); idx < rows * d; idx += gstride()) {
    i64 row = idx / d, j = idx % d;
    i64 ti = row % t, bi = row / (h * t);
    const i64 base = row * d;
    if (j >= dims) { stf(y, dt, idx, ldf(x, dt, idx)); continue; }
    i64 i = interleaved ? j / 2 : (j < half ? j : j - half);
    i64 ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
    float p = (float)ld_index(pos, pos_kind, pos_batched ? bi * t + ti : ti);
    float sn, cs;
    sincosf(p * scale * ldf(freq, fdt, i), &sn, &cs);
    float a = ldf(x, dt, base + ia), c = ldf(x, dt, base + ib);
    stf(y, dt, idx, j == ia ? a * cs - c * sn : a * sn + c * cs);
  }
}

// new [B, H, T, D] into cache [B, H, S, D] at pos (scalar or [B]); raw elements of `size` bytes.
extern "C" __global__ void kv_write(void* cache, const void* nw, int size, const void* pos, int pos_kind, int pos_len,
                                    i64 b, i64 h, i64 s, i64 t, i64 d, int* error, int tag) {
  const i64 n = b * h * t * d;
  for (i64 idx = gid(); idx < n; idx += gstride()) {
    i64 j = idx % d, ti = (idx / d) % t, hi = (idx / (d * t)) % h, bi = idx / (d * t * h);
    i64 p = ld_index(pos, pos_kind, pos_len == 1 ? 0 : bi);
    if (p < 0 || p + t > s) { atomicCAS(error, 0, tag); continue; }
    i64 dst = ((bi * h + hi) * s + p + ti) * d + j;
    if (size == 4) ((unsigned*)cache)[dst] = ((const unsigned*)nw)[idx];
    else ((unsigned short*)cache)[dst] = ((const unsigned short*)nw)[idx];
  }
}

// One block (128 threads) per query row (b, hq, t): scores over the valid keys, softmax, then
// the weighted sum of values. Scores live in dynamic shared memory (S floats).
extern "C" __global__ void attention(const void* q, int qdt, const void* k, const void* v, int kdt, const void* kv_len,
                                     int len_kind, int len_count, void* y, int ydt, i64 hq, i64 hkv, i64 t, i64 s,
                                     i64 d, i64 dv, float scale, int causal, i64 window, float softcap, int* error,
                                     int tag) {
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
  const i64 qbase = row * d;
  float m = -INFINITY;
  for (i64 j = lo_key + threadIdx.x; j < hi_key; j += blockDim.x) {
    float acc = 0.0f;
    for (i64 c = 0; c < d; c++) acc += ldf(q, qdt, qbase + c) * ldf(k, kdt, (kbase + j) * d + c);
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
    for (i64 j = lo_key; j < hi_key; j++) acc += scores[j - lo_key] * ldf(v, kdt, (kbase + j) * dv + c);
    stf(y, ydt, row * dv + c, acc * inv);
  }
}

// s = a + b (rounded to sdt, stored: the residual stream) and y = rms_norm(s) in one pass; one
// block per row of D.
extern "C" __global__ void add_rms_norm(const void* a, const void* b, void* s, int sdt, const void* w, int wdt, void* y,
                                        int ydt, i64 d, float eps, int unit_offset) {
  const i64 base = (i64)blockIdx.x * d;
  float ss = 0.0f;
  for (i64 j = threadIdx.x; j < d; j += blockDim.x) {
    float v = ldf(a, sdt, base + j) + ldf(b, sdt, base + j);
    stf(s, sdt, base + j, v);
    v = ldf(s, sdt, base + j);
    ss += v * v;
  }
  ss = block_sum(ss);
  float inv = rsqrtf(ss / (float)d + eps);
  for (i64 j = threadIdx.x; j < d; j += blockDim.x) {
    float g = ldf(w, wdt, j) + (unit_offset ? 1.0f : 0.0f);
    stf(y, ydt, base + j, ldf(s, sdt, base + j) * inv * g);
  }
}
