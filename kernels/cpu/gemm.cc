#include "kernels/cpu/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>

namespace heavykv::cpu {
namespace {

// All CPU parallelism goes through one OpenMP pool. BLAS runs single-threaded inside it: letting
// OpenBLAS's own pthreads spin beside OpenMP's on 2 cores made a batched step 20x slower.
void EnsureBlasSingleThreaded() {
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}

void MatmulSlice(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,
                 int64_t ldy, float beta) {
  if (m == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, w, k, x, 1, beta, y, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k, w, k, beta, y, ldy);
  }
}

}  // namespace

void MatmulNT(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,
              bool accumulate) {
  EnsureBlasSingleThreaded();
  const float beta = accumulate ? 1.0f : 0.0f;
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  // Below ~2M multiply-adds a fork/join costs more than it saves, more so on a busy machine
  // where a barrier waits for a descheduled thread.
  if (threads == 1 || m * n * k < (int64_t(1) << 21) || n < 64 * threads) {
    MatmulSlice(x, w, y, m, n, k, n, beta);
    return;
  }
  // Split the output columns (rows of w) so each thread streams its own part of the weights.
  const int64_t chunk = ((n + threads - 1) / threads + 15) / 16 * 16;
#pragma omp parallel for num_threads(threads) schedule(static, 1)
  for (int i = 0; i < threads; ++i) {
    const int64_t n0 = i * chunk;
    const int64_t nn = std::min(chunk, n - n0);
    if (nn > 0) MatmulSlice(x, w + n0 * k, y + n0, m, nn, k, n, beta);
  }
}

void Sgemm(const float* a, const float* b, float* y, int64_t m, int64_t n, int64_t k) {
  // The reference speed: OpenBLAS with its own threading, as any BLAS user would call it.
  openblas_set_num_threads(omp_get_max_threads());
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, k, b, n, 0.0f, y, n);
  openblas_set_num_threads(1);
}

void SetNumThreads(int n) {
  EnsureBlasSingleThreaded();
  omp_set_num_threads(n);
}

int GetNumThreads() { return omp_get_max_threads(); }

}  // namespace heavykv::cpu
