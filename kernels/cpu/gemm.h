// BLAS (OpenBLAS) GEMMs on row-major matrices, and the CPU thread count. The model's weights
// go through the packed kernel instead (packed_gemm.h); these are the reference speeds the
// benchmark compares it with, and the path for row-major operands.
#pragma once

#include <cstdint>

namespace heavykv::cpu {

// y[m][n] = x[m][k] * w[n][k]^T (+ y if accumulate): activations of m tokens against a weight
// matrix stored [out][in], split over the threads by output columns. m == 1 uses a GEMV.
void MatmulNT(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,
              bool accumulate = false);

// y[m][n] = a[m][k] * b[k][n], plain sgemm; used by the benchmark as the BLAS reference speed.
void Sgemm(const float* a, const float* b, float* y, int64_t m, int64_t n, int64_t k);

// Threads BLAS and the OpenMP kernels may use.
void SetNumThreads(int n);
int GetNumThreads();

}  // namespace heavykv::cpu
