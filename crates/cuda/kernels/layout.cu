// Transpose, slice, broadcast, concat: one strided copy. Both views share `shape`; element
// `idx` of it is read at src_off + Σ idx[a]·src_stride[a], written at dst_off + Σ idx[a]·dst_stride[a].
struct View8 {
  int rank;
  i64 shape[8];
  i64 src_stride[8];
  i64 dst_stride[8];
  i64 src_off;
  i64 dst_off;
};

extern "C" __global__ void strided_copy(const unsigned char* src, unsigned char* dst, int size, View8 v, i64 n) {
  for (i64 idx = gid(); idx < n; idx += gstride()) {
    i64 rem = idx, s = v.src_off, d = v.dst_off;
    for (int a = v.rank - 1; a >= 0; a--) {
      i64 i = rem % v.shape[a];
      rem /= v.shape[a];
      s += i * v.src_stride[a];
      d += i * v.dst_stride[a];
    }
    for (int b = 0; b < size; b++) dst[d * size + b] = src[s * size + b];
  }
}
