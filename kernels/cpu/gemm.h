// GEMMs for the CPU backend, through BLAS (OpenBLAS).
#pragma once

#include <cstdint>

namespace heavykv::cpu {

// y[m][n] = x[m][k] * w[n][k]^T (+ y if accumulate). Every projection of the model is this shape:
// activations of all m tokens of a step against one weight matrix stored [out][in]. m == 1 uses a
// GEMV, which BLAS runs at memory bandwidth.
void MatmulNT(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,
              bool accumulate = false);

// y[m][n] = a[m][k] * b[k][n], plain sgemm; used by the benchmark as the BLAS reference speed.
void Sgemm(const float* a, const float* b, float* y, int64_t m, int64_t n, int64_t k);

// Threads BLAS and the OpenMP kernels may use.
void SetNumThreads(int n);
int GetNumThreads();

}  // namespace heavykv::cpu
