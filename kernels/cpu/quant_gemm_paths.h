// Internal to quant_gemm.cc: the AVX2 pieces of MatmulQuant, in the source file compiled for
// AVX2 (quant_gemm_avx2.cc). Not for other callers: use MatmulQuant (quant_gemm.h).
#pragma once

#include <cstdint>

#include "kernels/cpu/quant_types.h"

namespace heavykv::cpu::internal {

// out[k] = the row of `type` at src (AVX2 + FMA + F16C; every AVX2 CPU has F16C).
void DequantizeRowAvx2(QuantType type, const uint8_t* src, float* out, int64_t k);
// out[i] = sum_kk x[i * k + kk] * w[kk] for i < m.
void DotRowsAvx2(const float* x, int64_t m, int64_t k, const float* w, float* out);
// panel[kk * 48 + j] = rows[j * k + kk] for j < 8, kk < k: eight dequantized rows into eight
// columns of an fp32 panel (PackedMatrix's layout; `panel` points at the first column).
void TransposeRows8Avx2(const float* rows, int64_t k, float* panel);

}  // namespace heavykv::cpu::internal
