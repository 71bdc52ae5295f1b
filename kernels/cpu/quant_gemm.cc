#include "kernels/cpu/quant_gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/packed_gemm_panels.h"
#include "kernels/cpu/packed_matrix.h"
#include "kernels/cpu/quant_gemm_paths.h"
#include "memory/aligned_vector.h"

namespace heavykv::cpu {
namespace {

constexpr int kGroupRows = 8;  // rows dequantized together, then transposed into the panel

// Per-thread scratch, grown on demand and kept for the thread's life (the OpenMP pool's threads
// persist), so a call never allocates, nor faults in fresh pages, once warm.
float* Scratch(AlignedVector<float>& buf, int64_t elems) {
  if (static_cast<int64_t>(buf.size()) < elems) buf.resize(elems);
  return buf.data();
}

void Dequantize(Isa isa, const QuantMatrix& w, int64_t r, float* out) {
  if (isa == Isa::kPortable) {
    w.DequantizeRowTo(r, out);
  } else {
    internal::DequantizeRowAvx2(w.type(), w.row(r), out, w.cols());
  }
}

void DotRows(Isa isa, const float* x, int64_t m, int64_t k, const float* wrow, float* out) {
  if (isa == Isa::kPortable) {
    for (int64_t i = 0; i < m; ++i) {
      float acc = 0.0f;
      for (int64_t kk = 0; kk < k; ++kk) acc += x[i * k + kk] * wrow[kk];
      out[i] = acc;
    }
  } else {
    internal::DotRowsAvx2(x, m, k, wrow, out);
  }
}

// Rows [r0, r0 + count) of W against the m (<= kQuantRowPathMaxM) rows of x.
void RowPath(Isa isa, const float* x, const QuantMatrix& w, float* y, int64_t m, int64_t ldy,
             bool accumulate, int64_t r0, int64_t count) {
  thread_local AlignedVector<float> row_buf;
  const int64_t k = w.cols();
  float* row = Scratch(row_buf, k);
  float dots[kQuantRowPathMaxM];
  for (int64_t r = r0; r < r0 + count; ++r) {
    Dequantize(isa, w, r, row);
    DotRows(isa, x, m, k, row, dots);
    for (int64_t i = 0; i < m; ++i)
      y[i * ldy + r] = accumulate ? y[i * ldy + r] + dots[i] : dots[i];
  }
}

// Panel p of W (rows p * 48 ..), dequantized into PackedMatrix's fp32 panel layout, against all
// of x.
void PanelPath(Isa isa, const float* x, const QuantMatrix& w, float* y, int64_t m, int64_t ldy,
               bool accumulate, int64_t p) {
  thread_local AlignedVector<float> rows_buf, panel_buf;
  const int64_t n = w.rows(), k = w.cols();
  float* rows = Scratch(rows_buf, kGroupRows * k);    // [8][k]
  float* panel = Scratch(panel_buf, k * kPanelRows);  // [k][48]
  const int ncols = static_cast<int>(std::min(kPanelRows, n - p * kPanelRows));
  for (int j0 = 0; j0 < kPanelRows; j0 += kGroupRows) {
    for (int j = j0; j < j0 + kGroupRows; ++j) {
      float* dst = rows + (j - j0) * k;
      // Rows past n are zeros: the kernel multiplies them but never stores their outputs.
      if (j < ncols) {
        Dequantize(isa, w, p * kPanelRows + j, dst);
      } else {
        std::memset(dst, 0, k * sizeof(float));
      }
    }
    if (isa == Isa::kPortable) {
      for (int j = 0; j < kGroupRows; ++j) {
        for (int64_t kk = 0; kk < k; ++kk) panel[kk * kPanelRows + j0 + j] = rows[j * k + kk];
      }
    } else {
      internal::TransposeRows8Avx2(rows, k, panel + j0);
    }
  }
  internal::PanelFp32(isa, x, panel, nullptr, k * kPanelRows, y + p * kPanelRows, m, k, ldy,
                      accumulate, ncols);
}

}  // namespace

void MatmulQuantWith(Isa isa, const float* x, const QuantMatrix& w, float* y, int64_t m,
                     int64_t ldy, bool accumulate) {
  const int64_t n = w.rows(), k = w.cols();
  if (m <= 0 || n == 0) return;
  const int64_t panels = (n + kPanelRows - 1) / kPanelRows;
  const bool parallel = !omp_in_parallel() && m * n * k >= (int64_t(1) << 21);
  // schedule(static): contiguous ranges of rows keep each thread's weight stream sequential.
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t p = 0; p < panels; ++p) {
    if (m <= kQuantRowPathMaxM) {
      const int64_t r0 = p * kPanelRows;
      RowPath(isa, x, w, y, m, ldy, accumulate, r0, std::min(kPanelRows, n - r0));
    } else {
      PanelPath(isa, x, w, y, m, ldy, accumulate, p);
    }
  }
}

void MatmulQuant(const float* x, const QuantMatrix& w, float* y, int64_t m, int64_t ldy,
                 bool accumulate) {
  MatmulQuantWith(BestIsa(), x, w, y, m, ldy, accumulate);
}

void DequantizeRowWith(Isa isa, const QuantMatrix& w, int64_t r, float* out) {
  Dequantize(isa, w, r, out);
}

}  // namespace heavykv::cpu
