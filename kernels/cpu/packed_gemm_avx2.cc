// The AVX2 + FMA kernel of MatmulPacked (packed_gemm.h), for CPUs without AVX-512 (AMD Zen 1-3,
// Intel client cores). 16 ymm registers allow 12 accumulators: the main tile is 6 rows of x by
// 2 vectors (16 outputs) of the panel, the classic 6x16 shape of BLIS's Haswell sgemm, and a
// 48-output panel is covered in 3 such column groups. Short tails (1-2 rows, as in a batch-1
// decode) use all 6 vectors of the panel at once (bf16: 3, see VecsFor) so that the weight stream
// stays nearly sequential.
//
// The inputs are cut into chunks of kKc: a chunk of one panel (kKc x 48 floats = 96 KiB) is
// contiguous in the k-major layout, stays in L2 while every row tile and column group passes over
// it (x's chunk, 6 rows x kKc, stays in L1), and the next chunk (of this panel or the next one)
// is prefetched at an even rate during all of those passes, so memory and arithmetic overlap.
#include <immintrin.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cpu/packed_gemm_panels.h"
#include "kernels/cpu/packed_matrix.h"

namespace heavykv::cpu::internal {
namespace {

constexpr int64_t kKc = 512;  // inputs per chunk; even, so bf16 pairs never straddle chunks
constexpr int kMr = 6;        // rows of x in the main tile

// Vectors of 8 outputs per pass for a tile of `rows` rows: 12 accumulators at most, and with bf16
// weights (whose widened vectors and raw words both occupy registers) few enough that nothing
// spills to the stack: GCC 12 spilled the 2x6 and 4x3 bf16 tiles.
template <typename T>
constexpr int VecsFor(int rows) {
  if constexpr (std::is_same_v<T, float>) {
    return rows <= 2 ? 6 : rows <= 4 ? 3 : 2;
  } else {
    return rows <= 2 ? 3 : 2;
  }
}

// acc[i][j] += x[i * ldx + kk] * w[j] for the tile's rows.
template <int MR, int NV>
__attribute__((target("avx2,fma"), always_inline)) inline void Fma(__m256 (&acc)[MR][NV],
                                                                   const float* x, int64_t ldx,
                                                                   int64_t kk,
                                                                   const __m256 (&w)[NV]) {
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    const __m256 xv = _mm256_broadcast_ss(x + i * ldx + kk);
#pragma GCC unroll 6
    for (int j = 0; j < NV; ++j) acc[i][j] = _mm256_fmadd_ps(xv, w[j], acc[i][j]);
  }
}

// y[MR][NV * 8 outputs] (+)= x[MR][kc] * w^T. x: row i at x + i * ldx; w: the chunk of the panel
// at this column group (input kk's 8 * NV outputs at w + kk * kPanelRows, in T's units; bf16:
// pairs (kk, kk + 1) in one word, kk even). ncols: outputs of this group that exist.
template <int MR, int NV, typename T>
__attribute__((target("avx2,fma"))) void Tile(const float* x, int64_t ldx, const T* w,
                                              int64_t kc, float* y, int64_t ldy, bool accumulate,
                                              int ncols, Prefetch pf) {
  __m256 acc[MR][NV];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 6
    for (int j = 0; j < NV; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  __m256 wv[NV];
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t kk = 0; kk < kc; ++kk) {
      pf.Step();
#pragma GCC unroll 6
      for (int j = 0; j < NV; ++j) wv[j] = _mm256_loadu_ps(w + kk * kPanelRows + j * 8);
      Fma<MR, NV>(acc, x, ldx, kk, wv);
    }
  } else {
    // The high half of each word is input kk, the low half input kk + 1 (zero past an odd k).
    const __m256i high = _mm256_set1_epi32(int(0xFFFF0000u));
    for (int64_t kk = 0; kk < kc; kk += 2) {
      pf.Step();
      __m256i raw[NV];
#pragma GCC unroll 6
      for (int j = 0; j < NV; ++j) {
        raw[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + kk * kPanelRows + j * 16));
        wv[j] = _mm256_castsi256_ps(_mm256_and_si256(raw[j], high));
      }
      Fma<MR, NV>(acc, x, ldx, kk, wv);
      if (kk + 1 == kc) break;
#pragma GCC unroll 6
      for (int j = 0; j < NV; ++j) wv[j] = _mm256_castsi256_ps(_mm256_slli_epi32(raw[j], 16));
      Fma<MR, NV>(acc, x, ldx, kk + 1, wv);
    }
  }
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
#pragma GCC unroll 6
  for (int j = 0; j < NV; ++j) {
    const int c = ncols - j * 8;
    if (c <= 0) break;
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(c), lane);
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      float* dst = y + i * ldy + j * 8;
      __m256 v = acc[i][j];
      if (c >= 8) {
        if (accumulate) v = _mm256_add_ps(v, _mm256_loadu_ps(dst));
        _mm256_storeu_ps(dst, v);
      } else {
        if (accumulate) v = _mm256_add_ps(v, _mm256_maskload_ps(dst, mask));
        _mm256_maskstore_ps(dst, mask, v);
      }
    }
  }
}

// Every column group of one row tile of `rows` (1..kMr) rows over one chunk. `pass` counts the
// passes made so far over this chunk; each takes its share of the next chunk's prefetch.
template <typename T>
__attribute__((target("avx2,fma"))) void RowTile(int rows, const float* x, int64_t ldx,
                                                 const T* w, int64_t kc, float* y, int64_t ldy,
                                                 bool accumulate, int ncols, const char* pf_begin,
                                                 int64_t pf_lines, int64_t passes, int64_t* pass) {
  constexpr int64_t kElemsPerOutput = std::is_same_v<T, float> ? 1 : 2;
  const int nv = VecsFor<T>(rows);
  const int64_t steps = std::is_same_v<T, float> ? kc : (kc + 1) / 2;
  for (int c0 = 0; c0 < ncols; c0 += nv * 8) {
    Prefetch pf;
    if (pf_lines > 0) {
      const int64_t first = pf_lines * *pass / passes, last = pf_lines * (*pass + 1) / passes;
      pf.begin = pf_begin + first * 64;
      pf.lines = last - first;
      pf.per_iter = (pf.lines + steps - 1) / steps;
    }
    ++*pass;
    const T* wg = w + c0 * kElemsPerOutput;
    float* yg = y + c0;
    const int nc = ncols - c0;
    switch (rows) {
      case 1: Tile<1, VecsFor<T>(1), T>(x, ldx, wg, kc, yg, ldy, accumulate, nc, pf); break;
      case 2: Tile<2, VecsFor<T>(2), T>(x, ldx, wg, kc, yg, ldy, accumulate, nc, pf); break;
      case 3: Tile<3, VecsFor<T>(3), T>(x, ldx, wg, kc, yg, ldy, accumulate, nc, pf); break;
      case 4: Tile<4, VecsFor<T>(4), T>(x, ldx, wg, kc, yg, ldy, accumulate, nc, pf); break;
      case 5: Tile<5, VecsFor<T>(5), T>(x, ldx, wg, kc, yg, ldy, accumulate, nc, pf); break;
      default: Tile<6, VecsFor<T>(6), T>(x, ldx, wg, kc, yg, ldy, accumulate, nc, pf); break;
    }
  }
}

}  // namespace

template <typename T>
void PanelAvx2(const float* x, const T* panel, const T* next, int64_t panel_elems, float* y,
               int64_t m, int64_t k, int64_t ldy, bool accumulate, int ncols) {
  // Passes over one chunk: the column groups of every row tile.
  const auto groups = [&](int rows) {
    return (ncols + VecsFor<T>(rows) * 8 - 1) / (VecsFor<T>(rows) * 8);
  };
  const int64_t full_tiles = m / kMr;
  const int tail = static_cast<int>(m % kMr);
  const int64_t passes = full_tiles * groups(kMr) + (tail > 0 ? groups(tail) : 0);
  for (int64_t k0 = 0; k0 < k; k0 += kKc) {
    const int64_t kc = std::min(kKc, k - k0);
    const T* w = panel + k0 * kPanelRows;  // bf16: k0 is even, pairs start at k0 / 2 * 2 * 48
    // The next chunk: contiguous after this one, in this panel or at the start of `next`.
    const char* pf_begin = nullptr;
    int64_t pf_bytes = 0;
    if (k0 + kKc < k) {
      pf_begin = reinterpret_cast<const char*>(w + kc * kPanelRows);
      pf_bytes = std::min(kKc, k - k0 - kKc) * kPanelRows * int64_t(sizeof(T));
    } else if (next != nullptr) {
      pf_begin = reinterpret_cast<const char*>(next);
      pf_bytes = std::min(kKc * kPanelRows, panel_elems) * int64_t(sizeof(T));
    }
    const int64_t pf_lines = (pf_bytes + 63) / 64;
    const bool acc = accumulate || k0 > 0;
    int64_t pass = 0;
    for (int64_t i = 0; i < m; i += kMr) {
      const int rows = static_cast<int>(std::min<int64_t>(kMr, m - i));
      RowTile(rows, x + i * k + k0, k, w, kc, y + i * ldy, ldy, acc, ncols, pf_begin, pf_lines,
              passes, &pass);
    }
  }
}

template void PanelAvx2<float>(const float*, const float*, const float*, int64_t, float*, int64_t,
                               int64_t, int64_t, bool, int);
template void PanelAvx2<uint16_t>(const float*, const uint16_t*, const uint16_t*, int64_t, float*,
                                  int64_t, int64_t, int64_t, bool, int);

}  // namespace heavykv::cpu::internal
