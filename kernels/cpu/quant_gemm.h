// The GEMM on quantized weights: y = x W^T for fp32 activations x[m][k] and a QuantMatrix W[n][k]
// of any QuantType, any m (1 for a single decode, a batch of decodes, or a prefill chunk).
//
// Two arithmetics, chosen per call by QuantUsesInt8 (the rule below):
//  - int8 (the block formats Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K, any m): each activation row is
//    quantized once per call to int8 with one step per 32 inputs (per 256 for the K-quants), as
//    llama.cpp does, and the weights' levels take integer dot products with it (quant_dot.h:
//    AVX512-VNNI or AVX-VNNI dpbusd, AVX-512BW / AVX2 maddubs, or portable loops; with AVX-512,
//    Q4_K / Q6_K / Q8_0 rows for m <= 4 are decoded in registers straight from their blocks). The
//    result is the exact product of the dequantized weights with the rounded activations, up to
//    fp32 summation: it differs from the fp32 product by at most sum_i |w_i| s_i / 2 per output,
//    s_i the step of input i's block (amax / 127), and by about sqrt(sum_i w_i^2 s_i^2 / 12).
//  - fp32 (F32 / F16 / BF16, and QuantPath::kFp32 for tests and benchmarks): the weights are
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

// Which arithmetic MatmulQuantWith uses: kAuto is MatmulQuant's rule (QuantUsesInt8); kInt8 where
// the type has no int8 kernel (F32, F16, BF16) runs fp32.
enum class QuantPath { kAuto, kFp32, kInt8 };

// The rule (QuantUsesInt8): the block formats always take the int8 path, F16 / BF16 / F32 the fp32
// one. Measured on Zen 5 with AVX512-VNNI (docs/BENCHMARKS.md, quant_gemm, int8 against the fp32
// path on the same matrices, side by side): on one thread int8 is 1.9-6.5x as fast at m = 1,
// 2.2-3.3x at m = 8, 1.6-2.0x at m = 32, 1.4-1.6x at m = 64..128 and 1.1-1.3x at m = 256..512
// (prefill), for every block format and llama3.2-1b shape; on two threads 0.96-1.12x at m = 512
// (the 2048 x 2048 matrix the closest). No m is left where fp32 is clearly faster. (On AVX2-only
// CPUs, where the int8 dot is maddubs + madd, not yet measured.)

// Largest m for which the fp32 path goes row by row rather than by panels (only F16 / BF16 / F32
// weights, and QuantPath::kFp32, take the fp32 path at such m).
inline constexpr int64_t kQuantRowPathMaxM = 3;

// y[m][ldy] (+)= x[m][k] * W^T, ldy >= W.rows(); x rows contiguous ([m][k]). Parallel with OpenMP
// unless already inside a parallel region or under ~2M multiply-adds. Runs BestIsa().
void MatmulQuant(const float* x, const QuantMatrix& w, float* y, int64_t m, int64_t ldy,
                 bool accumulate);
// The same with `isa`'s kernels, which the CPU must support (IsaSupported), and `path`'s
// arithmetic: for tests, which run every path the machine has, and benchmarks. AVX-512 uses the
// AVX2 dequantizers and unpackers, the AVX-512 panel kernel, and the AVX512-VNNI dot kernel where
// the CPU has VNNI (else AVX-512BW's).
void MatmulQuantWith(Isa isa, const float* x, const QuantMatrix& w, float* y, int64_t m,
                     int64_t ldy, bool accumulate, QuantPath path = QuantPath::kAuto);
// The team form, for a decode step that runs in one OpenMP parallel region (engine/runner's
// ModelRunner): every thread of the enclosing region calls it with the same arguments, at the
// same point of its code (it is an OpenMP worksharing loop). Each thread quantizes x into its own
// buffer (m x k inputs: microseconds, less than a barrier would cost), then the threads take W's
// blocks of 16 rows in chunks as they come (schedule(guided): shrinking chunks, down to 4 blocks),
// so that a thread that loses its core for a moment leaves its share to the others. It ends with
// no barrier: the caller puts one before y is read. Requires QuantUsesInt8(w.type(), m); same
// arithmetic as MatmulQuant, bit for bit (each output is computed by one thread in the same order).
void MatmulQuantTeam(const float* x, const QuantMatrix& w, float* y, int64_t m, int64_t ldy,
                     bool accumulate);
void MatmulQuantTeamWith(Isa isa, const float* x, const QuantMatrix& w, float* y, int64_t m,
                         int64_t ldy, bool accumulate);

// Whether MatmulQuant takes the int8 path for `type` at batch m (the rule above).
bool QuantUsesInt8(QuantType type, int64_t m);

// out[k] = row `r` of w dequantized with `isa`'s code (the portable one is
// QuantMatrix::DequantizeRowTo); for tests of the vector dequantizers.
void DequantizeRowWith(Isa isa, const QuantMatrix& w, int64_t r, float* out);

}  // namespace heavykv::cpu
