// Internal to quant_gemm.cc: the int8 path of MatmulQuant. The activation rows are quantized once
// per call to int8 (QuantActs), weight rows are unpacked slice by slice into one byte per level
// with float scales (UnpackedSlice), and each ISA's kernel takes integer dot products of byte
// levels with int8 activations, four inputs per 32-bit lane (maddubs + madd on AVX2 and AVX-512,
// dpbusd with AVX-VNNI and AVX512-VNNI), converting each lane to fp32 once per 16 inputs it
// sums. Not for other callers: use MatmulQuant (quant_gemm.h).
//
// Both sides describe their numbers with floats per group of 16 inputs, so every weight type
// (32-element blocks, or 256-element super-blocks with 16- or 32-element sub-blocks) runs the same
// kernel:
//   activations: qs[i] int8; scale[h] for each group h of 16, the step of its block (32 inputs
//                like ggml's Q8_0 for Q8_0 / Q4_0 / Q5_0 weights, 256 like Q8_K for the
//                K-quants); sum[h] = scale[h] * (qs[16h] + .. + qs[16h + 15]);
//   weights:     lv[i] unsigned levels, wsc[h] and wmn[h] per group with w_i = wsc[h] * lv[i] -
//                wmn[h];
// so sum_i w_i x_i ~= sum_h wsc[h] * scale[h] * (lv . qs)_h - wmn[h] * sum[h]: integer dots,
// and one conversion, scale and offset (ggml's mins and the -8 / -16 / -32 of the signed formats)
// per 16 inputs. The vector kernels read levels and activations permuted so that each 32-bit lane
// of a vector sums one group (PermuteLevels*, quant_dot_kernel.h). Q8_0's levels are its int8
// values + 128 (wmn = 128 d), where the maddubs kernels, which saturate at 16 bits, go back to the
// signed values (signed_levels).
#pragma once

#include <cstdint>

#include "kernels/cpu/quant_dot_kernel.h"
#include "kernels/cpu/quant_types.h"

namespace heavykv::cpu::internal {

// Inputs unpacked per weight row at a time (a multiple of 256 and of kDotPad).
inline constexpr int64_t kDotSlice = 1024;
// Weight rows per tile: unpacked together and dotted with each activation row's slice while it is
// in registers / L1.
inline constexpr int kDotTileRows = 4;

// Whether the int8 path has a kernel for `type` (the block formats; not F32/F16/BF16).
bool HasInt8Dot(QuantType type);
// The activation block for `type`'s int8 path: 256 for the K-quants, else 32.
int64_t Int8ActBlock(QuantType type);

// Activation rows x[m][k] quantized with one step per `block` (32 or 256) inputs (amax / 127,
// rounded to nearest): qs [m][kp], scale and sum [m][kp / 16], kp = k rounded up to
// kDotPad, the padding zeros.
struct QuantActs {
  int64_t m = 0, k = 0, kp = 0, block = 32;
  int8_t* qs = nullptr;
  float* scale = nullptr;
  float* sum = nullptr;
};
// Rows [i0, i1) of x into `a` (whose arrays hold m rows). Portable code, vectorised by the
// compiler; the same rounding on every ISA.
void QuantizeActRows(const float* x, int64_t i0, int64_t i1, const QuantActs& a);

// One weight row's inputs [k0, k0 + len) (len a multiple of the block, k0 of kDotSlice) unpacked:
// lv [kp_len] levels in natural order, wsc and wmn [kp_len / 16], kp_len = len rounded up to
// kDotPad (the padding's levels 0 and scales 0). avx2: with UnpackSliceAvx2 (the CPU must have AVX2
// and F16C); the same bytes and floats either way.
void UnpackSlice(QuantType type, const uint8_t* row, int64_t k0, int64_t len,
                 const UnpackedSlice& out, bool avx2);

// AVX512-VNNI (CPUID leaf 7, ECX bit 11) and AVX-VNNI (leaf 7 sub-leaf 1, EAX bit 4), read from
// CPUID as HasF16c does.
bool HasAvx512Vnni();
bool HasAvxVnni();

}  // namespace heavykv::cpu::internal
