// A GEMM for few activation rows against a large weight matrix, y = x * w^T, as in a decode step
// (m = batch size). General BLAS packs the whole weight matrix into a buffer and only then
// computes, so a step pays the weights' trip from memory and the arithmetic one after the other;
// this kernel streams each weight row once from memory straight into registers and uses it
// against every activation row while it is in L1, so the two overlap.
#pragma once

#include <cstdint>

namespace heavykv::cpu {

// Largest m the skinny kernel is used for; beyond it BLAS's blocking wins.
inline constexpr int64_t kSkinnyMaxRows = 64;

// y[m][ldy] (+)= x[m][k] * w[n][k]^T. Returns false, touching nothing, when this CPU or shape is
// not supported (needs AVX-512F, k % 16 == 0, n % 4 == 0, 1 <= m <= kSkinnyMaxRows); the caller
// then uses BLAS. Parallel over the rows of w with OpenMP.
bool SkinnyMatmulNT(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,
                    int64_t ldy, bool accumulate);

}  // namespace heavykv::cpu
