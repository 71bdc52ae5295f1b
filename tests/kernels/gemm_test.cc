// The CPU GEMM paths against a plain triple loop in double: the packed-weight kernel (every ISA
// path the CPU runs: AVX-512, AVX2, portable; every row-tile size, partial last panels, an output
// stride wider than n, threads, accumulation), PackedMatrix's layout round trip, and the BLAS
// MatmulNT.
#include "kernels/cpu/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/aligned_vector.h"
#include "kernels/bf16.h"
#include "kernels/cpu/packed_gemm.h"
#include "kernels/cpu/packed_matrix.h"
#include "tests/test_util.h"

namespace heavykv::cpu {
namespace {


double RelError(const float* y, const std::vector<double>& ref, int64_t m, int64_t n,
                int64_t ldy) {
  double err = 0, norm = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const double d = y[i * ldy + j] - ref[i * n + j];
      err += d * d;
      norm += ref[i * n + j] * ref[i * n + j];
    }
  }
  return std::sqrt(err / norm);
}

// kPacked runs MatmulPacked (the best ISA); kPackedIsa runs MatmulPackedWith(isa).
enum class Path { kBlas, kPacked, kPackedIsa };

// With bf16 weights the reference multiplies by the weights rounded to bf16, so the packed
// kernels are held to the same fp32 accuracy (the rounding itself is the user's choice).
void Check(Path path, int64_t m, int64_t n, int64_t k, bool accumulate, int threads,
           WeightType type = WeightType::kFp32, Isa isa = Isa::kPortable) {
  SCOPED_TRACE(::testing::Message() << "path=" << int(path) << " isa=" << IsaName(isa) << " m=" << m << " n=" << n
                                  << " k=" << k << " acc=" << accumulate
                                  << " threads=" << threads << " bf16=" << (type == WeightType::kBf16));
  SetNumThreads(threads);
  std::mt19937 rng(m * 1000 + n + k);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  // Packed outputs go to rows wider than n, to check that nothing past column n is written.
  const int64_t ldy = path == Path::kBlas ? n : n + 5;
  std::vector<float> x(m * k), w(n * k), y0(m * n);
  for (float& v : x) v = u(rng);
  for (float& v : w) v = u(rng);
  for (float& v : y0) v = u(rng);
  std::vector<float> w_ref = w;
  if (type == WeightType::kBf16) {
    for (float& v : w_ref) v = Bf16ToFloat(FloatToBf16(v));
  }
  AlignedVector<float> xa(x.begin(), x.end()), wa(w.begin(), w.end()), y(m * ldy, 7.0f);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) y[i * ldy + j] = y0[i * n + j];
  }
  const PackedMatrix packed = PackedMatrix::FromRowMajor(wa.data(), n, k, type);
  switch (path) {
    case Path::kBlas:
      MatmulNT(xa.data(), wa.data(), y.data(), m, n, k, accumulate);
      break;
    case Path::kPacked:
      MatmulPacked(xa.data(), packed, y.data(), m, ldy, accumulate);
      break;
    case Path::kPackedIsa:
      MatmulPackedWith(isa, xa.data(), packed, y.data(), m, ldy, accumulate);
      break;
  }
  std::vector<double> ref =
      testing::ReferenceMatmul(x, w_ref, accumulate ? y0 : std::vector<float>{}, m, n, k);
  EXPECT_LT(RelError(y.data(), ref, m, n, ldy), 1e-6);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = n; j < ldy; ++j) ASSERT_EQ(y[i * ldy + j], 7.0f) << "wrote past column n";
  }
}

TEST(GemmTest, PackedKernelMatchesReferenceOnEveryIsa) {
  for (Isa isa : heavykv::testing::IsasToTest()) {
    for (int threads : {1, 2}) {
      // m: one decode, every tail of the 6- and 8-row tiles, a decode batch, prefill chunks.
      for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 15, 16, 32, 64, 65, 100}) {
        Check(Path::kPackedIsa, m, 96, 64, false, threads, WeightType::kFp32, isa);  // whole panels
        // A partial last panel (260 % 48 = 20): partial column groups of every tile width.
        Check(Path::kPackedIsa, m, 260, 48, true, threads, WeightType::kFp32, isa);
      }
      // Large enough to split over threads; k over several of the AVX2 kernel's 512-input
      // chunks, the last one partial (k = 700), and one chunk exactly (k = 256).
      Check(Path::kPackedIsa, 32, 4096, 768, true, threads, WeightType::kFp32, isa);
      Check(Path::kPackedIsa, 7, 150, 1100, false, threads, WeightType::kFp32, isa);
      Check(Path::kPackedIsa, 2, 100, 512, true, threads, WeightType::kFp32, isa);
      Check(Path::kPackedIsa, 3, 10, 7, false, threads, WeightType::kFp32, isa);  // < 1 vector
    }
  }
  // MatmulPacked is the best ISA's path.
  Check(Path::kPacked, 32, 260, 300, true, 2);
}

TEST(GemmTest, PackedBf16WeightsMatchReferenceOnEveryIsa) {
  const WeightType bf16 = WeightType::kBf16;
  for (Isa isa : heavykv::testing::IsasToTest()) {
    for (int threads : {1, 2}) {
      for (int64_t m : {1, 2, 3, 4, 5, 6, 8, 9, 32, 65}) {
        Check(Path::kPackedIsa, m, 96, 64, false, threads, bf16, isa);
        Check(Path::kPackedIsa, m, 260, 47, true, threads, bf16, isa);  // partial panel, odd k
      }
      Check(Path::kPackedIsa, 32, 4096, 768, true, threads, bf16, isa);
      Check(Path::kPackedIsa, 7, 150, 1101, false, threads, bf16, isa);  // odd k over chunks
      Check(Path::kPackedIsa, 3, 10, 7, false, threads, bf16, isa);
    }
  }
  Check(Path::kPacked, 32, 260, 301, true, 2, bf16);
}

TEST(GemmTest, BlasMatchesReference) {
  for (int threads : {1, 2}) {
    for (int64_t m : {1, 2, 7, 32, 65}) {
      Check(Path::kBlas, m, 256, 768, false, threads);
      Check(Path::kBlas, m, 260, 64, true, threads);
    }
    Check(Path::kBlas, 32, 4096, 768, true, threads);  // split over threads
  }
}

TEST(GemmTest, PackedMatrixRoundTrip) {
  const int64_t n = 100, k = 9;  // three panels, the last one partial
  std::vector<float> w(n * k);
  for (int64_t i = 0; i < n * k; ++i) w[i] = float(i);
  const PackedMatrix p = PackedMatrix::FromRowMajor(w.data(), n, k);
  EXPECT_EQ(p.num_panels(), 3);
  // The layout itself: data[panel][kk][j] = w[panel * 48 + j][kk], zero padded.
  EXPECT_EQ(p.packed()[0], w[0]);
  EXPECT_EQ(p.packed()[1], w[1 * k]);
  EXPECT_EQ(p.packed()[kPanelRows], w[1]);
  EXPECT_EQ(p.packed()[2 * k * kPanelRows + 3], w[(2 * kPanelRows + 3) * k]);
  EXPECT_EQ(p.packed()[2 * k * kPanelRows + kPanelRows - 1], 0.0f);  // row 143 is padding
  std::vector<float> back(n * k, -1.0f);
  p.ToRowMajor(back.data());
  EXPECT_EQ(back, w);
  std::vector<float> row(k);
  p.Row(57, row.data());
  EXPECT_EQ(row, std::vector<float>(w.begin() + 57 * k, w.begin() + 58 * k));
  EXPECT_EQ(p.bytes(), 3 * k * kPanelRows * 4);
  // bf16: the same layout of rounded values, half the bytes. 0.1 * i is rarely exact in bf16.
  for (int64_t i = 0; i < n * k; ++i) w[i] = 0.1f * float(i);
  const PackedMatrix h = PackedMatrix::FromRowMajor(w.data(), n, k, WeightType::kBf16);
  EXPECT_TRUE(h.bf16());
  EXPECT_EQ(h.bytes(), 3 * (k + 1) * kPanelRows * 2);  // k = 9 padded to an even 10
  // The pair layout: word [kk / 2][j] holds input kk in its high half, kk + 1 in its low one.
  const uint16_t* b = h.packed_bf16();
  EXPECT_EQ(b[1], FloatToBf16(w[0]));          // row 0, input 0: high half of word 0
  EXPECT_EQ(b[0], FloatToBf16(w[1]));          // row 0, input 1: low half
  EXPECT_EQ(b[2 * 5 + 1], FloatToBf16(w[5 * k]));  // row 5, input 0
  EXPECT_EQ(b[2 * kPanelRows + 3], FloatToBf16(w[1 * k + 2]));  // row 1, input 2: next pair
  EXPECT_EQ(b[4 * 2 * kPanelRows + 0], 0);     // row 0, input 9: the odd padding
  EXPECT_EQ(PackedMatrix::IndexInPanel(8, 0, true), 4 * 2 * kPanelRows + 1);
  h.ToRowMajor(back.data());
  int changed = 0;
  for (int64_t i = 0; i < n * k; ++i) {
    ASSERT_EQ(back[i], Bf16ToFloat(FloatToBf16(w[i]))) << i;
    ASSERT_LE(std::fabs(back[i] - w[i]), std::fabs(w[i]) / 256) << i;  // 8 significant bits
    changed += back[i] != w[i];
  }
  EXPECT_GT(changed, n * k / 2);
}

}  // namespace
}  // namespace heavykv::cpu
