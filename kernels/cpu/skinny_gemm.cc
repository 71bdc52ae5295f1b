#include "kernels/cpu/skinny_gemm.h"

#include <omp.h>

#include <cstring>

namespace heavykv::cpu {
namespace {

typedef float V16 __attribute__((vector_size(64)));
// A tile is kMr activation rows x kNr weight rows: 24 accumulators, 4 weight vectors and one
// activation vector in the 32 zmm registers. Measured on the stories110M step shapes against
// 8x3, 2x12, 2x8 and 4x5 tiles: 4x6 was the fastest (1.3x OpenBLAS, cold weights).
constexpr int kNr = 4;
constexpr int kMr = 6;

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

// y[i][j] for i < MR rows of x and the kNr weight rows at w. With `prefetch`, the next tile's
// weight rows are requested from memory while this one computes.
template <int MR>
__attribute__((target("avx512f"))) void Tile(const float* x, const float* w, float* y,
                                             int64_t k, int64_t ldy, bool accumulate,
                                             bool prefetch) {
  V16 acc[MR][kNr];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < kNr; ++j) acc[i][j] = V16{};
  }
  for (int64_t kk = 0; kk < k; kk += 16) {
    if (prefetch) {
#pragma GCC unroll 8
      for (int j = 0; j < kNr; ++j) __builtin_prefetch(w + (kNr + j) * k + kk, 0, 1);
    }
    V16 wv[kNr];
#pragma GCC unroll 8
    for (int j = 0; j < kNr; ++j) wv[j] = Load(w + j * k + kk);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const V16 xv = Load(x + i * k + kk);
#pragma GCC unroll 8
      for (int j = 0; j < kNr; ++j) acc[i][j] += xv * wv[j];
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < kNr; ++j) {
      const float v = Sum(acc[i][j]);
      y[i * ldy + j] = accumulate ? y[i * ldy + j] + v : v;
    }
  }
}

template <int MR>
__attribute__((target("avx512f"))) void TailTile(int64_t rows, const float* x, const float* w,
                                                 float* y, int64_t k, int64_t ldy,
                                                 bool accumulate, bool prefetch) {
  if constexpr (MR > 0) {
    if (rows == MR) {
      Tile<MR>(x, w, y, k, ldy, accumulate, prefetch);
    } else {
      TailTile<MR - 1>(rows, x, w, y, k, ldy, accumulate, prefetch);
    }
  }
}

__attribute__((target("avx512f"))) void RowsTile(const float* x, const float* w, float* y,
                                                 int64_t m, int64_t k, int64_t ldy,
                                                 bool accumulate, bool prefetch) {
  // Only the first pass over the tile prefetches: one request per cache line is enough.
  int64_t i = 0;
  for (; i + kMr <= m; i += kMr) {
    Tile<kMr>(x + i * k, w, y + i * ldy, k, ldy, accumulate, prefetch && i == 0);
  }
  if (i < m) {
    TailTile<kMr - 1>(m - i, x + i * k, w, y + i * ldy, k, ldy, accumulate, prefetch && i == 0);
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
