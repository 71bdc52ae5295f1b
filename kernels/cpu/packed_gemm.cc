#include "kernels/cpu/packed_gemm.h"

#include <immintrin.h>
#include <omp.h>

// GCC 12 warns that the AVX-512 shift intrinsics read an uninitialised value: its own
// _mm512_undefined_epi32() placeholder (GCC bug 105593), not ours.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <algorithm>
#include <type_traits>

#include "kernels/bf16.h"
#include "kernels/cpu/packed_gemm_panels.h"

namespace heavykv::cpu {
namespace {

using internal::Prefetch;

constexpr int kVecs = kPanelRows / 16;  // accumulator vectors per activation row
// Rows of x per register tile: 8 x 3 accumulators, 3 weight vectors and a broadcast fill 28 of
// the 32 zmm registers. Measured against 6x4, 8x2 and 12x2 tiles on the stories110M decode
// shapes: 8x3 was the fastest (and reaches ~155 GFLOP/s per core with weights in cache).
constexpr int kMr = 8;

inline float WeightAt(const float* p) { return *p; }
inline float WeightAt(const uint16_t* p) { return Bf16ToFloat(*p); }

// acc[i][j] += x[i * k + kk] * w[j] for the tile's rows.
template <int MR>
__attribute__((target("avx512f"), always_inline)) inline void Fma(__m512 (&acc)[MR][kVecs],
                                                                  const float* x, int64_t k,
                                                                  int64_t kk,
                                                                  const __m512 (&w)[kVecs]) {
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    const __m512 xv = _mm512_set1_ps(x[i * k + kk]);
#pragma GCC unroll 3
    for (int j = 0; j < kVecs; ++j) acc[i][j] = _mm512_fmadd_ps(xv, w[j], acc[i][j]);
  }
}

// y[MR][0..ncols) (+)= x[MR][k] * panel^T; T is the weight element (float or bf16 bits).
template <int MR, typename T>
__attribute__((target("avx512f"))) void Tile(const float* x, const T* panel, float* y,
                                             int64_t k, int64_t ldy, bool accumulate, int ncols,
                                             Prefetch pf) {
  __m512 acc[MR][kVecs];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 3
    for (int j = 0; j < kVecs; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  __m512 w[kVecs];
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t kk = 0; kk < k; ++kk) {
      pf.Step();
#pragma GCC unroll 3
      for (int j = 0; j < kVecs; ++j) w[j] = _mm512_load_ps(panel + kk * kPanelRows + j * 16);
      Fma<MR>(acc, x, k, kk, w);
    }
  } else {
    // Input pairs (kk, kk + 1): the high halves of the words are W[.][kk], the low ones
    // W[.][kk + 1]; an odd last input has a zero low half, never used.
    const __m512i high = _mm512_set1_epi32(int(0xFFFF0000u));
    for (int64_t kk = 0; kk < k; kk += 2) {
      pf.Step();
      const uint16_t* pair = panel + kk * kPanelRows;  // (kk / 2) * 2 * kPanelRows
#pragma GCC unroll 3
      for (int j = 0; j < kVecs; ++j) {
        w[j] = _mm512_castsi512_ps(_mm512_and_si512(_mm512_load_si512(pair + j * 32), high));
      }
      Fma<MR>(acc, x, k, kk, w);
      if (kk + 1 == k) break;
#pragma GCC unroll 3
      for (int j = 0; j < kVecs; ++j) {
        w[j] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_load_si512(pair + j * 32), 16));
      }
      Fma<MR>(acc, x, k, kk + 1, w);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 3
    for (int j = 0; j < kVecs; ++j) {
      const int c = ncols - j * 16;
      const __mmask16 mask = c >= 16 ? __mmask16(0xFFFF) : c <= 0 ? 0 : __mmask16((1u << c) - 1);
      float* dst = y + i * ldy + j * 16;
      __m512 v = acc[i][j];
      if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, dst));
      _mm512_mask_storeu_ps(dst, mask, v);
    }
  }
}

template <int MR, typename T>
__attribute__((target("avx512f"))) void TailTile(int64_t rows, const float* x,
                                                 const T* panel, float* y, int64_t k,
                                                 int64_t ldy, bool accumulate, int ncols,
                                                 Prefetch pf) {
  if constexpr (MR > 0) {
    if (rows == MR) {
      Tile<MR, T>(x, panel, y, k, ldy, accumulate, ncols, pf);
    } else {
      TailTile<MR - 1, T>(rows, x, panel, y, k, ldy, accumulate, ncols, pf);
    }
  }
}

// One panel against every row of x; `next` is the panel to prefetch (null for the last).
template <typename T>
__attribute__((target("avx512f"))) void PanelAvx512(const float* x, const T* panel,
                                                    const T* next, int64_t panel_elems, float* y,
                                                    int64_t m, int64_t k, int64_t ldy,
                                                    bool accumulate, int ncols) {
  const int64_t tiles = (m + kMr - 1) / kMr;
  const int64_t steps = std::is_same_v<T, float> ? k : (k + 1) / 2;  // loop trips of a tile
  const int64_t panel_lines = (panel_elems * int64_t(sizeof(T)) + 63) / 64;
  const int64_t lines_per_tile = (panel_lines + tiles - 1) / tiles;
  int64_t i = 0;
  for (int64_t t = 0; i < m; ++t, i += kMr) {
    Prefetch pf;
    if (next != nullptr) {
      const int64_t first = std::min(t * lines_per_tile, panel_lines);
      pf.begin = reinterpret_cast<const char*>(next) + first * 64;
      pf.lines = std::min(lines_per_tile, panel_lines - first);
      pf.per_iter = (pf.lines + steps - 1) / steps;
    }
    if (i + kMr <= m) {
      Tile<kMr, T>(x + i * k, panel, y + i * ldy, k, ldy, accumulate, ncols, pf);
    } else {
      TailTile<kMr - 1, T>(m - i, x + i * k, panel, y + i * ldy, k, ldy, accumulate, ncols, pf);
    }
  }
}

// The same product without AVX-512.
template <typename T>
void PanelPortable(const float* x, const T* panel, float* y, int64_t m, int64_t k,
                   int64_t ldy, bool accumulate, int ncols) {
  for (int64_t i = 0; i < m; ++i) {
    float acc[kPanelRows] = {};
    for (int64_t kk = 0; kk < k; ++kk) {
      const float xv = x[i * k + kk];
      for (int j = 0; j < kPanelRows; ++j) {
        acc[j] += xv * WeightAt(panel + PackedMatrix::IndexInPanel(kk, j, !std::is_same_v<T, float>));
      }
    }
    for (int j = 0; j < ncols; ++j) y[i * ldy + j] = accumulate ? y[i * ldy + j] + acc[j] : acc[j];
  }
}

template <typename T>
void MatmulPackedImpl(const float* x, const PackedMatrix& w, const T* data, float* y, int64_t m,
                      int64_t ldy, bool accumulate, Isa isa) {
  const int64_t n = w.rows(), k = w.cols(), panels = w.num_panels();
  if (m <= 0 || n == 0) return;
  // Below ~2M multiply-adds a fork/join costs more than it saves, more so on a busy machine
  // where a barrier waits for a descheduled thread.
  const bool parallel = !omp_in_parallel() && m * n * k >= (int64_t(1) << 21);
  // schedule(static): contiguous panel ranges keep each thread's weight stream sequential.
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t p = 0; p < panels; ++p) {
    const T* panel = data + p * w.panel_elems();
    const T* next = p + 1 < panels ? panel + w.panel_elems() : nullptr;
    const int ncols = static_cast<int>(std::min(kPanelRows, n - p * kPanelRows));
    float* yp = y + p * kPanelRows;
    switch (isa) {
      case Isa::kAvx512:
        PanelAvx512(x, panel, next, w.panel_elems(), yp, m, k, ldy, accumulate, ncols);
        break;
      case Isa::kAvx2:
        internal::PanelAvx2(x, panel, next, w.panel_elems(), yp, m, k, ldy, accumulate, ncols);
        break;
      case Isa::kPortable:
        PanelPortable(x, panel, yp, m, k, ldy, accumulate, ncols);
        break;
    }
  }
}

}  // namespace

namespace internal {

void PanelFp32(Isa isa, const float* x, const float* panel, const float* next, int64_t panel_elems,
               float* y, int64_t m, int64_t k, int64_t ldy, bool accumulate, int ncols) {
  switch (isa) {
    case Isa::kAvx512:
      PanelAvx512(x, panel, next, panel_elems, y, m, k, ldy, accumulate, ncols);
      break;
    case Isa::kAvx2:
      PanelAvx2(x, panel, next, panel_elems, y, m, k, ldy, accumulate, ncols);
      break;
    case Isa::kPortable:
      PanelPortable(x, panel, y, m, k, ldy, accumulate, ncols);
      break;
  }
}

}  // namespace internal

void MatmulPackedWith(Isa isa, const float* x, const PackedMatrix& w, float* y, int64_t m,
                      int64_t ldy, bool accumulate) {
  if (w.bf16()) {
    MatmulPackedImpl(x, w, w.packed_bf16(), y, m, ldy, accumulate, isa);
  } else {
    MatmulPackedImpl(x, w, w.packed(), y, m, ldy, accumulate, isa);
  }
}

void MatmulPacked(const float* x, const PackedMatrix& w, float* y, int64_t m, int64_t ldy,
                  bool accumulate) {
  MatmulPackedWith(BestIsa(), x, w, y, m, ldy, accumulate);
}

}  // namespace heavykv::cpu
