// The GEMM on quantized weights: y = x W^T for fp32 activations x[m][k] and a QuantMatrix W[n][k]
// of any QuantType, any m (1 for a single decode, a batch of decodes, or a prefill chunk).
//
// Two arithmetics, chosen per call by QuantUsesInt8 (the rule below):
//  - int8 (the block formats Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K, for decode-sized m): each
//    activation row is quantized once per call to int8 with one step per 32 inputs (per 256 for
//    the K-quants), as llama.cpp does, and the weights' levels take integer dot products with it
//    (quant_dot.h: AVX512-VNNI dpbusd, AVX-512BW / AVX2 maddubs, or portable loops). The result
//    is the exact product of the dequantized weights with the rounded activations, up to fp32
//    summation: it differs from the fp32 product by at most sum_i |w_i| s_i / 2 per output, s_i
//    the step of input i's block (amax / 127), and by about sqrt(sum_i w_i^2 s_i^2 / 12).
//  - fp32 (F32 / F16 / BF16 always, the block formats at prefill-sized m): the weights are
//    dequantized on the fly and the activations are never quantized, so the result is the fp32
//    product with the dequantized matrix up to fp32 rounding. For m <= kQuantRowPathMaxM each
//    weight row is dequantized into an L1-resident buffer and dotted with the m rows of x; above
//    it, 48 rows at a time are dequantized into a thread-local panel in PackedMatrix's fp32
//    layout and the packed GEMM's panel kernel (packed_gemm.h) multiplies the whole of x by it,
//    so a weight is dequantized once per call however large m is.
// Threads split the outputs into contiguous ranges of rows (16 for int8, 48 for fp32) and stream
// their rows' bytes in address order.
#pragma once

#include <cstdint>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/quant_matrix.h"

namespace heavykv::cpu {

// Which arithmetic MatmulQuantWith uses: kAuto is MatmulQuant's rule (QuantUsesInt8); kInt8
// where the type has no int8 kernel (F32, F16, BF16) runs fp32.
enum class QuantPath { kAuto, kFp32, kInt8 };

// Largest m that takes the int8 path (block formats only). Measured on Zen 5 (docs/BENCHMARKS.md,
// quant_gemm, one thread): int8 is 1.5-3x the fp32 path's speed at m = 1..32 for every block
// format; at m = 64 the two are within +-20% of each other (either way, by shape); from m = 128
// on the fp32 panel kernel is as fast or up to 1.35x faster (it keeps 24 accumulators busy on
// dequantized panels, while the int8 tile reloads both sides' scales per chunk), so prefill
// chunks stay fp32.
inline constexpr int64_t kQuantInt8MaxM = 48;

// Largest m for which the fp32 path goes row by row rather than by panels (only F16 / BF16 / F32
// weights, and QuantPath::kFp32, take the fp32 path at such m).
inline constexpr int64_t kQuantRowPathMaxM = 3;

// y[m][ldy] (+)= x[m][k] * W^T, ldy >= W.rows(); x rows contiguous ([m][k]). Parallel with
// OpenMP unless already inside a parallel region or under ~2M multiply-adds. Runs BestIsa().
void MatmulQuant(const float* x, const QuantMatrix& w, float* y, int64_t m, int64_t ldy,
                 bool accumulate);
// The same with `isa`'s kernels, which the CPU must support (IsaSupported), and `path`'s
// arithmetic: for tests, which run every path the machine has, and benchmarks. AVX-512 uses the
// AVX2 dequantizers and unpackers, the AVX-512 panel kernel, and the AVX512-VNNI dot kernel where
// the CPU has VNNI (else AVX-512BW's).
void MatmulQuantWith(Isa isa, const float* x, const QuantMatrix& w, float* y, int64_t m,
                     int64_t ldy, bool accumulate, QuantPath path = QuantPath::kAuto);
// Whether MatmulQuant takes the int8 path for `type` at batch m (the rule above).
bool QuantUsesInt8(QuantType type, int64_t m);

// out[k] = row `r` of w dequantized with `isa`'s code (the portable one is
// QuantMatrix::DequantizeRowTo); for tests of the vector dequantizers.
void DequantizeRowWith(Isa isa, const QuantMatrix& w, int64_t r, float* out);

}  // namespace heavykv::cpu
