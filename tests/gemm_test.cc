// The CPU GEMM paths against a plain triple loop: BLAS (m == 1 and m > 64), the skinny streaming
// kernel (2 <= m <= 64, when the CPU has AVX-512), column slices over threads, accumulation.
#include "kernels/cpu/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/skinny_gemm.h"
#include "memory/aligned_vector.h"

namespace heavykv::cpu {
namespace {

// y[m][n] = x[m][k] w[n][k]^T (+ y0), in double.
std::vector<double> Reference(const std::vector<float>& x, const std::vector<float>& w,
                              const std::vector<float>& y0, int64_t m, int64_t n, int64_t k) {
  std::vector<double> y(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = y0.empty() ? 0.0 : y0[i * n + j];
      for (int64_t d = 0; d < k; ++d) acc += double(x[i * k + d]) * w[j * k + d];
      y[i * n + j] = acc;
    }
  }
  return y;
}

void Check(int64_t m, int64_t n, int64_t k, bool accumulate, int threads) {
  SCOPED_TRACE(testing::Message() << "m=" << m << " n=" << n << " k=" << k
                                  << " acc=" << accumulate << " threads=" << threads);
  SetNumThreads(threads);
  std::mt19937 rng(m * 1000 + n + k);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(m * k), w(n * k), y0(m * n);
  for (float& v : x) v = u(rng);
  for (float& v : w) v = u(rng);
  for (float& v : y0) v = u(rng);
  AlignedVector<float> xa(x.begin(), x.end()), wa(w.begin(), w.end()), y(y0.begin(), y0.end());
  MatmulNT(xa.data(), wa.data(), y.data(), m, n, k, accumulate);
  std::vector<double> ref = Reference(x, w, accumulate ? y0 : std::vector<float>{}, m, n, k);
  double err = 0, norm = 0;
  for (int64_t i = 0; i < m * n; ++i) {
    err += (y[i] - ref[i]) * (y[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  EXPECT_LT(std::sqrt(err / norm), 1e-6);
}

TEST(GemmTest, MatchesReferenceOnEveryPath) {
  for (int threads : {1, 2}) {
    for (int64_t m : {1, 2, 5, 6, 7, 13, 32, 64, 65, 100}) {
      Check(m, 256, 768, false, threads);
      Check(m, 260, 64, true, threads);
    }
    Check(32, 4096, 768, true, threads);  // large enough to split over threads
    Check(3, 172, 172, false, threads);   // k and n the skinny kernel does not take: BLAS
  }
}

TEST(GemmTest, SkinnyKernelDeclinesUnsupportedShapes) {
  std::vector<float> x(65 * 48), w(8 * 48), y(65 * 8, 7.0f);
  EXPECT_FALSE(SkinnyMatmulNT(x.data(), w.data(), y.data(), 65, 8, 48, 8, false));  // m > 64
  EXPECT_FALSE(SkinnyMatmulNT(x.data(), w.data(), y.data(), 2, 8, 40, 8, false));   // k % 16
  EXPECT_FALSE(SkinnyMatmulNT(x.data(), w.data(), y.data(), 2, 6, 48, 6, false));   // n % 4
  for (float v : y) EXPECT_EQ(v, 7.0f);  // declining touches nothing
}

}  // namespace
}  // namespace heavykv::cpu
