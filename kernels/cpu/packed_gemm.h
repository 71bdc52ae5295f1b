// The engine's CPU GEMM: y = x W^T for activations x[m][k] and a PackedMatrix W[n][k], any m
// (1 for a single decode, a batch of decodes, or a prefill chunk).
//
// Each thread takes a contiguous range of panels, so its weight stream is sequential; a panel
// (48 outputs x k) is used against all m rows while it sits in L2, and the next panel is
// prefetched at an even rate during the current one, so reading the weights from memory
// overlaps the arithmetic instead of preceding it. On the stories110M decode step at batch 32
// this reaches 0.72 of square sgemm's FLOP/s, against 0.39 for OpenBLAS on the same shapes, on
// an AVX-512 Xeon, and 1.48x OpenBLAS with the AVX2 kernel on an AMD Zen (docs/BENCHMARKS.md).
#pragma once

#include <cstdint>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/packed_matrix.h"

namespace heavykv::cpu {

// y[m][ldy] (+)= x[m][k] * W^T, ldy >= W.rows(); x rows are contiguous ([m][k]). Parallel over
// panels with OpenMP unless already inside a parallel region. Runs the kernel of BestIsa():
// AVX-512 (packed_gemm.cc), AVX2 + FMA (packed_gemm_avx2.cc) or a portable loop.
void MatmulPacked(const float* x, const PackedMatrix& w, float* y, int64_t m, int64_t ldy,
                  bool accumulate);
// The same with the kernel of `isa`, which the CPU must support (IsaSupported): for tests, which
// run every path the machine has, and benchmarks.
void MatmulPackedWith(Isa isa, const float* x, const PackedMatrix& w, float* y, int64_t m,
                      int64_t ldy, bool accumulate);

}  // namespace heavykv::cpu
