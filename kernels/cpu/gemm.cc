#include "kernels/cpu/gemm.h"

#include <cblas.h>
#include <omp.h>

namespace heavykv::cpu {

void MatmulNT(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,
              bool accumulate) {
  const float beta = accumulate ? 1.0f : 0.0f;
  if (m == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, w, k, x, 1, beta, y, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k, w, k, beta, y, n);
}

void Sgemm(const float* a, const float* b, float* y, int64_t m, int64_t n, int64_t k) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, k, b, n, 0.0f, y, n);
}

void SetNumThreads(int n) {
  openblas_set_num_threads(n);
  omp_set_num_threads(n);
}

int GetNumThreads() { return omp_get_max_threads(); }

}  // namespace heavykv::cpu
