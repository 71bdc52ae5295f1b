// Internal to packed_gemm.cc: the per-ISA kernels for one panel of a PackedMatrix, each in the
// source file compiled for its ISA. Not for other callers: use MatmulPacked (packed_gemm.h).
#pragma once

#include <cstdint>

namespace heavykv::cpu::internal {

// y[m][0..ncols) (+)= x[m][k] * panel^T for one panel ([k][kPanelRows] fp32, or bf16 input
// pairs when T is uint16_t; panel_elems elements of T); `next` is the panel that follows in this
// thread's range (its first bytes are prefetched during this one), or null.
template <typename T>
void PanelAvx2(const float* x, const T* panel, const T* next, int64_t panel_elems, float* y,
               int64_t m, int64_t k, int64_t ldy, bool accumulate, int ncols);

}  // namespace heavykv::cpu::internal
