// Routed-expert products at prefill, grouped by expert: moe_sort lists the (token, slot) pairs
// of each expert and cuts each expert's list into tiles, then grouped_rows (or grouped_qmm)
// multiplies each tile's pairs by its expert's 4-bit weight on the tensor cores, so an expert's
// weight is read once a tile rather than once a pair (gather_qmm). No host sync: the grid covers
// the most tiles there can be, and a block past the last tile returns at once. A block a tile,
// not an expert, keeps the grid full however the tokens are routed: when most of them choose
// the same few experts, those experts' tiles spread over many blocks.

// order [pairs]: the pairs grouped by expert (ascending expert; within one, in no fixed order:
// each pair's output depends only on its own row); offsets [experts + 1]: where each expert's
// pairs start; tiles: their count, then (expert, first pair) of each run of at most `tile` of an
// expert's pairs, in order. One block of 1024 threads, thread e the counts of expert e (at most
// 1024), scanned across the block by warp shuffles. An id out of range sets the error flag and
// its pair is left out.
extern "C" __global__ void moe_sort(const void* ids, int id_kind, i64 pairs, i64 experts, int* order, int* offsets,
                                    int* tiles, int tile, int* error, int tag) {
  __shared__ int count[1024], cursor[1024], warp_pairs[32], warp_tiles[32];
  const int e = threadIdx.x, lane = e & 31, warp = e >> 5;
  count[e] = 0;
  __syncthreads();
  for (i64 p = threadIdx.x; p < pairs; p += blockDim.x) {
    const i64 x = ld_index(ids, id_kind, p);
    if (x < 0 || x >= experts) atomicCAS(error, 0, tag);
    else atomicAdd(&count[x], 1);
  }
  __syncthreads();
  // Inclusive scans of the pairs and tiles of experts 0 .. e: within the warp, then across.
  const int mine = e < experts ? count[e] : 0, mine_tiles = (mine + tile - 1) / tile;
  int run = mine, runs = mine_tiles;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int a = __shfl_up_sync(0xffffffffu, run, o), b = __shfl_up_sync(0xffffffffu, runs, o);
    if (lane >= o) run += a, runs += b;
  }
  if (lane == 31) warp_pairs[warp] = run, warp_tiles[warp] = runs;
  __syncthreads();
  if (warp == 0) {
    int a = warp_pairs[lane], b = warp_tiles[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int c = __shfl_up_sync(0xffffffffu, a, o), d = __shfl_up_sync(0xffffffffu, b, o);
      if (lane >= o) a += c, b += d;
    }
    warp_pairs[lane] = a, warp_tiles[lane] = b;
  }
  __syncthreads();
  if (warp > 0) run += warp_pairs[warp - 1], runs += warp_tiles[warp - 1];
  if (e < experts) {
    const int start = run - mine;
    cursor[e] = offsets[e] = start;
    for (int m = 0, j = runs - mine_tiles; m < mine; m += tile, j++) {
      tiles[1 + 2 * j] = e;
      tiles[2 + 2 * j] = start + m;
    }
    if (e == experts - 1) offsets[experts] = run, tiles[0] = runs;
  }
  __syncthreads();
  for (i64 p = threadIdx.x; p < pairs; p += blockDim.x) {
    const i64 x = ld_index(ids, id_kind, p);
    if (x >= 0 && x < experts) order[atomicAdd(&cursor[x], 1)] = (int)p;
  }
}

// y [pairs, n] = x_p · W_eᵀ for 4-bit stacked expert weights (gather_qmm's operands; x f16 or
// bf16, k a multiple of 64, groups multiples of 8). Block (64-row tile of the weight, tile of
// 64 pairs of expert e) of 128 threads, k in chunks of 64: the pairs' rows of x and the weight
// tile dequantized to x's dtype (as the cuBLAS path expands it) in shared memory, then warp w
// takes pairs 16w .. 16w + 15 against all 64 rows with mma.m16n8k16, f32 accumulation.
// Each thread moves words c = tid % 8 of rows tid / 8 + 16j (j < 4) of both tiles, and requests
// the next chunk's before the tensor cores run on this one.
#define GQ_T 64
template <class X>
__device__ __forceinline__ void grouped_qmm(const void* x, i64 x_rows, const unsigned* w, const void* s, const void* z,
                                            int sdt, const int* order, const int* offsets, const int* tiles,
                                            void* y, int ydt, i64 top, i64 n, i64 k, int group) {
  typedef TensorCore<X> TC;
  union Word { uint4 u; typename X::T h[8]; };
  __shared__ __align__(16) unsigned short xs[GQ_T][GQ_T + 8];  // 16 bytes of padding a row: no
  __shared__ __align__(16) unsigned short ws[GQ_T][GQ_T + 8];  // bank conflicts on fragments
  if ((int)blockIdx.y >= tiles[0]) return;
  const i64 e = tiles[1 + 2 * blockIdx.y], n0 = (i64)blockIdx.x * GQ_T;
  const int m0 = tiles[2 + 2 * blockIdx.y], end = offsets[e + 1];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int c = threadIdx.x & 7, r0 = threadIdx.x >> 3;
  const i64 wrow = k / 8, groups = k / group;
  // This thread's weight rows (the same for every pair tile), or -1 past n.
  i64 wr[4];
#pragma unroll
  for (int j = 0; j < 4; j++) wr[j] = n0 + r0 + 16 * j < n ? e * n + n0 + r0 + 16 * j : -1;
  {
    const unsigned short* xp[4];  // this thread's rows of x at word c, or null past the pairs
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int m = m0 + r0 + 16 * j;
      xp[j] = nullptr;
      if (m < end) {
        const i64 p = order[m], xr = (p / top) * x_rows + (x_rows == 1 ? 0 : p % top);
        xp[j] = (const unsigned short*)x + xr * k + 8 * c;
      }
    }
    uint4 xv[4];
    unsigned wv[4];
    float sc[4], bi[4];
    auto fetch = [&](i64 k0) {
#pragma unroll
      for (int j = 0; j < 4; j++) {
        xv[j] = xp[j] ? *(const uint4*)(xp[j] + k0) : make_uint4(0, 0, 0, 0);
        const i64 at = wr[j] * groups + (k0 + 8 * c) / group;
        wv[j] = wr[j] >= 0 ? w[wr[j] * wrow + k0 / 8 + c] : 0u;
        sc[j] = wr[j] >= 0 ? ldf(s, sdt, at) : 0.0f;
        bi[j] = wr[j] >= 0 ? ldf(z, sdt, at) : 0.0f;
      }
    };
    fetch(0);
    float acc[GQ_T / 8][4];
#pragma unroll
    for (int j = 0; j < GQ_T / 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    for (i64 k0 = 0; k0 < k; k0 += GQ_T) {
      __syncthreads();  // the last chunk's readers are done
#pragma unroll
      for (int j = 0; j < 4; j++) {
        *(uint4*)&xs[r0 + 16 * j][8 * c] = xv[j];
        float q[8];
        qvals<4>(wv[j], q);
        Word d;
#pragma unroll
        for (int v = 0; v < 8; v++) X::st(d.h, v, q[v] * sc[j] + bi[j]);
        *(uint4*)&ws[r0 + 16 * j][8 * c] = d.u;
      }
      __syncthreads();
      if (k0 + GQ_T < k) fetch(k0 + GQ_T);
      if (m0 + 16 * warp >= end) continue;  // this warp's pairs are all past the expert's
#pragma unroll
      for (int kk = 0; kk < GQ_T / 16; kk++) {
        const int col = 16 * kk + 2 * tq;
        const unsigned a[4] = {*(const unsigned*)&xs[16 * warp + g][col],
                               *(const unsigned*)&xs[16 * warp + g + 8][col],
                               *(const unsigned*)&xs[16 * warp + g][col + 8],
                               *(const unsigned*)&xs[16 * warp + g + 8][col + 8]};
#pragma unroll
        for (int j = 0; j < GQ_T / 8; j++)
          TC::mma(acc[j], a, *(const unsigned*)&ws[8 * j + g][col], *(const unsigned*)&ws[8 * j + g][col + 8]);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int m = m0 + 16 * warp + g + 8 * h;
      if (m >= end) continue;
      const i64 p = order[m];
#pragma unroll
      for (int j = 0; j < GQ_T / 8; j++) {
        const i64 col = n0 + 8 * j + 2 * tq;
        if (col < n) stf(y, ydt, p * n + col, acc[j][2 * h]);
        if (col + 1 < n) stf(y, ydt, p * n + col + 1, acc[j][2 * h + 1]);
      }
    }
  }
}

// Unbounded (164 registers, three blocks an SM): prefill of qwen3-30b-a3b-4bit measured 7464
// tok/s against 6425 bounded at 128 (four blocks an SM; ptxas spills 32 bytes).
#define GROUPED_QMM(XN, X)                                                                                             \
  extern "C" __global__ void __launch_bounds__(128) grouped_qmm_##XN(                                                  \
      const void* x, i64 x_rows, const unsigned* w, const void* s, const void* z, int sdt, const int* order,           \
      const int* offsets, const int* tiles, void* y, int ydt, i64 top, i64 n, i64 k, int group) {                      \
    grouped_qmm<X>(x, x_rows, w, s, z, sdt, order, offsets, tiles, y, ydt, top, n, k, group);                          \
  }
GROUPED_QMM(f16, F16)
GROUPED_QMM(bf16, BF16)

// The same product with qmm_rows's blocks (gemv.cu): y [pairs, n] = x_p · W_eᵀ, 4-bit weights,
// n a multiple of 16, k of 128, groups of 32, 64 or 128. Block (128 weight rows, tile of 8·NT
// pairs of expert e) of 4 warps: the pairs' rows of x (through order) are the B operand, the
// weight rows, read straight from global memory and expanded in registers, the A operand; runs
// of 8 pairs past the tile's last are skipped. Against grouped_qmm it keeps a chunk of weights
// in flight in registers and expands each weight once for all of a tile's pairs.
template <class X, int NT>
__device__ __forceinline__ void grouped_rows(const void* x, i64 x_rows, const unsigned* w, const void* s,
                                             const void* z, int sdt, const int* order, const int* offsets,
                                             const int* tiles, void* y, int ydt, i64 top, i64 n, i64 k, int group) {
  __shared__ int xi[8 * NT], yi[8 * NT];  // the tile's rows of x and of y
  if ((int)blockIdx.y >= tiles[0]) return;
  const i64 e = tiles[1 + 2 * blockIdx.y];
  const int m0 = tiles[2 + 2 * blockIdx.y], end = offsets[e + 1];
  const int rows = end - m0 < 8 * NT ? end - m0 : 8 * NT;
  if (threadIdx.x < rows) {
    const i64 p = order[m0 + threadIdx.x];
    xi[threadIdx.x] = (int)((p / top) * x_rows + (x_rows == 1 ? 0 : p % top));
    yi[threadIdx.x] = (int)p;
  }
  __syncthreads();
  qmm_rows<X, NT, true>(x, w, s, z, sdt, y, ydt, nullptr, rows, n, k, group, 0, k / 128, 0, xi, yi, e * n);
}
// grouped_rows_{x}_{NT}: tiles of 64 pairs (8 runs of 8: two blocks an SM), of 32 (three; the
// default: routing that crowds onto few experts still makes many tiles) or of 16.
#define GROUPED_ROWS(XN, X, NT)                                                                                        \
  extern "C" __global__ void __launch_bounds__(128) grouped_rows_##XN##_##NT(                                          \
      const void* x, i64 x_rows, const unsigned* w, const void* s, const void* z, int sdt, const int* order,           \
      const int* offsets, const int* tiles, void* y, int ydt, i64 top, i64 n, i64 k, int group) {                      \
    grouped_rows<X, NT>(x, x_rows, w, s, z, sdt, order, offsets, tiles, y, ydt, top, n, k, group);                     \
  }
GROUPED_ROWS(f16, F16, 8)
GROUPED_ROWS(bf16, BF16, 8)
GROUPED_ROWS(f16, F16, 4)
GROUPED_ROWS(bf16, BF16, 4)
GROUPED_ROWS(f16, F16, 2)
GROUPED_ROWS(bf16, BF16, 2)
