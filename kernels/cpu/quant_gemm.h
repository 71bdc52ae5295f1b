// The GEMM on quantized weights: y = x W^T for fp32 activations x[m][k] and a QuantMatrix W[n][k]
// of any QuantType, any m (1 for a single decode, a batch of decodes, or a prefill chunk).
//
// The weights are dequantized on the fly and the arithmetic is fp32 (activations are never
// quantized), so the result is the fp32 product with the dequantized matrix up to fp32 rounding.
// Threads split the outputs into contiguous ranges of 48 rows, as MatmulPacked does, and stream
// their rows' bytes in address order. For m <= kQuantRowPathMaxM each weight row is dequantized
// into an L1-resident buffer and dotted with the m rows of x; above it, 48 rows at a time are
// dequantized into a thread-local panel in PackedMatrix's fp32 layout and the packed GEMM's panel
// kernel (packed_gemm.h) multiplies the whole of x by it, so a weight is dequantized once per call
// however large m is.
#pragma once

#include <cstdint>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/quant_matrix.h"

namespace heavykv::cpu {

// Which arithmetic MatmulQuantWith uses: kAuto is MatmulQuant's rule (QuantUsesInt8); kInt8
// where the type has no int8 kernel (F32, F16, BF16) runs fp32.
enum class QuantPath { kAuto, kFp32, kInt8 };

// Largest m that takes the int8 path (block formats only). Measured: docs/BENCHMARKS.md.
inline constexpr int64_t kQuantInt8MaxM = 1 << 30;

// Largest m that takes the row-by-row path. Not yet tuned: the m = 4..8 crossover against the
// panel path is still to be measured (docs/BENCHMARKS.md, quant_gemm).
inline constexpr int64_t kQuantRowPathMaxM = 3;

// y[m][ldy] (+)= x[m][k] * W^T, ldy >= W.rows(); x rows contiguous ([m][k]). Parallel with
// OpenMP unless already inside a parallel region or under ~2M multiply-adds. Runs BestIsa().
void MatmulQuant(const float* x, const QuantMatrix& w, float* y, int64_t m, int64_t ldy,
                 bool accumulate);
// The same with `isa`'s kernels, which the CPU must support (IsaSupported): for tests, which run
// every path the machine has, and benchmarks. AVX-512 uses the AVX2 dequantizers and the
// AVX-512 panel kernel.
void MatmulQuantWith(Isa isa, const float* x, const QuantMatrix& w, float* y, int64_t m,
                     int64_t ldy, bool accumulate, QuantPath path = QuantPath::kAuto);
// Whether MatmulQuant takes the int8 path for `type` at batch m (the rule above).
bool QuantUsesInt8(QuantType type, int64_t m);

// out[k] = row `r` of w dequantized with `isa`'s code (the portable one is
// QuantMatrix::DequantizeRowTo); for tests of the vector dequantizers.
void DequantizeRowWith(Isa isa, const QuantMatrix& w, int64_t r, float* out);

}  // namespace heavykv::cpu
