// Internal to packed_gemm.cc: the per-ISA kernels for one panel of a PackedMatrix, each in the
// source file compiled for its ISA. Not for other callers: use MatmulPacked (packed_gemm.h).
#pragma once

#include <xmmintrin.h>

#include <cstdint>

#include "kernels/cpu/isa.h"

namespace heavykv::cpu::internal {

// Prefetch of the next weights (a panel, or a chunk of one), shared out over the passes of the
// current ones: `lines` cache lines from `begin`, `per_iter` of them at each k step of a pass.
struct Prefetch {
  const char* begin = nullptr;
  int64_t lines = 0;
  int64_t per_iter = 0;
  int64_t issued = 0;  // lines prefetched so far

  // One k step's share (prefetcht1: into L2, where the next panel or chunk is read from).
  void Step() {
    for (int64_t r = 0; r < per_iter && issued < lines; ++r, ++issued) {
      _mm_prefetch(begin + issued * 64, _MM_HINT_T1);
    }
  }
};

// y[m][0..ncols) (+)= x[m][k] * panel^T for one panel ([k][kPanelRows] fp32, or bf16 input
// pairs when T is uint16_t; panel_elems elements of T); `next` is the panel that follows in this
// thread's range (its first bytes are prefetched during this one), or null.
template <typename T>
void PanelAvx2(const float* x, const T* panel, const T* next, int64_t panel_elems, float* y,
               int64_t m, int64_t k, int64_t ldy, bool accumulate, int ncols);

// One fp32 panel ([k][kPanelRows], panel_elems floats) against every row of x with `isa`'s
// kernel: MatmulPacked's inner step, for callers that build panels on the fly (MatmulQuant
// dequantizes weight rows into one). `next` (or null) is prefetched during this one.
void PanelFp32(Isa isa, const float* x, const float* panel, const float* next, int64_t panel_elems,
               float* y, int64_t m, int64_t k, int64_t ldy, bool accumulate, int ncols);

}  // namespace heavykv::cpu::internal
