#include "kernels/cpu/skinny_gemm.h"

#include <omp.h>

#include <cstring>

namespace heavykv::cpu {
namespace {

typedef float V16 __attribute__((vector_size(64)));
constexpr int kNr = 4;  // weight rows per tile
constexpr int kMr = 6;  // activation rows per tile: 6 x 4 accumulators + 5 operands fit 32 zmm

__attribute__((target("avx512f"), always_inline)) inline V16 Load(const float* p) {
  V16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

__attribute__((target("avx512f"), always_inline)) inline float Sum(V16 v) {
  float s = 0.0f;
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) s += v[i];
  return s;
}

// y[i][j] for i < MR rows of x and the kNr weight rows at w.
template <int MR>
__attribute__((target("avx512f"))) void Tile(const float* x, const float* w, float* y,
                                             int64_t k, int64_t ldy, bool accumulate,
                                             bool prefetch) {
  V16 acc[MR][kNr];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < kNr; ++j) acc[i][j] = V16{};
  }
  for (int64_t kk = 0; kk < k; kk += 16) {
    // The next tile's weight rows, from memory into L2 while this tile computes.
    if (prefetch) {
      __builtin_prefetch(w + 4 * k + kk, 0, 1);
      __builtin_prefetch(w + 5 * k + kk, 0, 1);
      __builtin_prefetch(w + 6 * k + kk, 0, 1);
      __builtin_prefetch(w + 7 * k + kk, 0, 1);
    }
    const V16 w0 = Load(w + kk), w1 = Load(w + k + kk), w2 = Load(w + 2 * k + kk),
              w3 = Load(w + 3 * k + kk);
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const V16 xv = Load(x + i * k + kk);
      acc[i][0] += xv * w0;
      acc[i][1] += xv * w1;
      acc[i][2] += xv * w2;
      acc[i][3] += xv * w3;
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < kNr; ++j) {
      const float v = Sum(acc[i][j]);
      y[i * ldy + j] = accumulate ? y[i * ldy + j] + v : v;
    }
  }
}

__attribute__((target("avx512f"))) void RowsTile(const float* x, const float* w, float* y,
                                                 int64_t m, int64_t k, int64_t ldy,
                                                 bool accumulate, bool prefetch) {
  int64_t i = 0;
  // Only the first pass over the tile prefetches: one request per cache line is enough.
  for (; i + kMr <= m; i += kMr) {
    Tile<kMr>(x + i * k, w, y + i * ldy, k, ldy, accumulate, prefetch && i == 0);
  }
  prefetch = prefetch && i == 0;
  const float* xr = x + i * k;
  float* yr = y + i * ldy;
  switch (m - i) {
    case 5: Tile<5>(xr, w, yr, k, ldy, accumulate, prefetch); break;
    case 4: Tile<4>(xr, w, yr, k, ldy, accumulate, prefetch); break;
    case 3: Tile<3>(xr, w, yr, k, ldy, accumulate, prefetch); break;
    case 2: Tile<2>(xr, w, yr, k, ldy, accumulate, prefetch); break;
    case 1: Tile<1>(xr, w, yr, k, ldy, accumulate, prefetch); break;
    default: break;
  }
}

}  // namespace

bool SkinnyMatmulNT(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,
                    int64_t ldy, bool accumulate) {
  static const bool has_avx512 = __builtin_cpu_supports("avx512f");
  if (!has_avx512 || m < 1 || m > kSkinnyMaxRows || k % 16 != 0 || n % kNr != 0) return false;
  const int64_t tiles = n / kNr;
  const bool parallel = !omp_in_parallel() && m * n * k >= (int64_t(1) << 21);
  // Contiguous ranges of weight rows per thread keep each thread's memory stream sequential.
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t t = 0; t < tiles; ++t) {
    RowsTile(x, w + t * kNr * k, y + t * kNr, m, k, ldy, accumulate, t + 1 < tiles);
  }
  return true;
}

}  // namespace heavykv::cpu
