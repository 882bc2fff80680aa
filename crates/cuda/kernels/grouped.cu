// Routed-expert products at prefill, grouped by expert: moe_sort lists the (token, slot) pairs
// of each expert, then grouped_qmm multiplies each expert's pairs by its weight on the tensor
// cores, so an expert's weight is read once for all the tokens routed to it (gather_qmm reads
// it once a pair). No host sync: the grid covers every expert, and an expert no pair chose
// returns at once.

// order [pairs]: the pairs grouped by expert (ascending expert; within one, in no fixed order:
// each pair's output depends only on its own row); offsets [experts + 1]: where each expert's
// pairs start. One block of 1024 threads; experts at most 1024. An id out of range sets the
// error flag and its pair is left out.
extern "C" __global__ void moe_sort(const void* ids, int id_kind, i64 pairs, i64 experts, int* order, int* offsets,
                                    int* error, int tag) {
  __shared__ int count[1024], cursor[1024];
  for (i64 e = threadIdx.x; e < experts; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (i64 p = threadIdx.x; p < pairs; p += blockDim.x) {
    const i64 e = ld_index(ids, id_kind, p);
    if (e < 0 || e >= experts) atomicCAS(error, 0, tag);
    else atomicAdd(&count[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int run = 0;
    for (i64 e = 0; e < experts; e++) {
      cursor[e] = offsets[e] = run;
      run += count[e];
    }
    offsets[experts] = run;
  }
  __syncthreads();
  for (i64 p = threadIdx.x; p < pairs; p += blockDim.x) {
    const i64 e = ld_index(ids, id_kind, p);
    if (e >= 0 && e < experts) order[atomicAdd(&cursor[e], 1)] = (int)p;
  }
}

// y [pairs, n] = x_p · W_eᵀ for 4-bit stacked expert weights (gather_qmm's operands; x f16 or
// bf16, k a multiple of 64, groups multiples of 8). Block (64-row tile of the weight, expert e)
// of 4 warps: for each 64 of e's pairs, k in chunks of 64: the pairs' rows of x and the weight
// tile dequantized to x's dtype (as the cuBLAS path expands it) in shared memory, then warp w
// takes pairs 16w .. 16w + 15 against all 64 rows with mma.m16n8k16, f32 accumulation.
#define GQ_T 64
template <class X>
__device__ __forceinline__ void grouped_qmm(const void* x, i64 x_rows, const unsigned* w, const void* s, const void* z,
                                            int sdt, const int* order, const int* offsets, void* y, int ydt, i64 top,
                                            i64 n, i64 k, int group) {
  typedef TensorCore<X> TC;
  union Word { uint4 u; typename X::T h[8]; };
  __shared__ __align__(16) unsigned short xs[GQ_T][GQ_T + 8];  // 16 bytes of padding a row: no
  __shared__ __align__(16) unsigned short ws[GQ_T][GQ_T + 8];  // bank conflicts on fragments
  const i64 e = blockIdx.y, n0 = (i64)blockIdx.x * GQ_T;
  const int begin = offsets[e], end = offsets[e + 1];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const i64 wrow = k / 8, groups = k / group;
  for (int m0 = begin; m0 < end; m0 += GQ_T) {
    float acc[GQ_T / 8][4];
#pragma unroll
    for (int j = 0; j < GQ_T / 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    for (i64 k0 = 0; k0 < k; k0 += GQ_T) {
      __syncthreads();  // the last chunk's readers are done
      for (int i = threadIdx.x; i < GQ_T * GQ_T / 8; i += blockDim.x) {
        const int r = i / (GQ_T / 8), c = i % (GQ_T / 8);
        uint4 v = make_uint4(0, 0, 0, 0);
        if (m0 + r < end) {
          const i64 p = order[m0 + r], xr = (p / top) * x_rows + (x_rows == 1 ? 0 : p % top);
          v = ((const uint4*)((const unsigned short*)x + xr * k + k0))[c];
        }
        *(uint4*)&xs[r][c * 8] = v;
        // Word c of the tile's row r: values k0 + 8c .. + 7, one group.
        Word d;
        d.u = make_uint4(0, 0, 0, 0);
        const i64 row = n0 + r;
        if (row < n) {
          const i64 at = (e * n + row) * groups + (k0 + 8 * c) / group;
          const float sc = ldf(s, sdt, at), bi = ldf(z, sdt, at);
          float q[8];
          qvals<4>(w[(e * n + row) * wrow + k0 / 8 + c], q);
#pragma unroll
          for (int j = 0; j < 8; j++) X::st(d.h, j, q[j] * sc + bi);
        }
        *(uint4*)&ws[r][c * 8] = d.u;
      }
      __syncthreads();
      if (m0 + 16 * warp >= end) continue;  // this warp's pairs are all past the expert's
#pragma unroll
      for (int kk = 0; kk < GQ_T / 16; kk++) {
        const int c = 16 * kk + 2 * tq;
        const unsigned a[4] = {*(const unsigned*)&xs[16 * warp + g][c], *(const unsigned*)&xs[16 * warp + g + 8][c],
                               *(const unsigned*)&xs[16 * warp + g][c + 8],
                               *(const unsigned*)&xs[16 * warp + g + 8][c + 8]};
#pragma unroll
        for (int j = 0; j < GQ_T / 8; j++)
          TC::mma(acc[j], a, *(const unsigned*)&ws[8 * j + g][c], *(const unsigned*)&ws[8 * j + g][c + 8]);
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

#define GROUPED_QMM(XN, X)                                                                                             \
  extern "C" __global__ void __launch_bounds__(128) grouped_qmm_##XN(                                                  \
      const void* x, i64 x_rows, const unsigned* w, const void* s, const void* z, int sdt, const int* order,           \
      const int* offsets, void* y, int ydt, i64 top, i64 n, i64 k, int group) {                                        \
    grouped_qmm<X>(x, x_rows, w, s, z, sdt, order, offsets, y, ydt, top, n, k, group);                                 \
  }
GROUPED_QMM(f16, F16)
GROUPED_QMM(bf16, BF16)
