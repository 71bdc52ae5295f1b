// The GGUF weight formats and the quantized GEMM: block geometry and type ids, fp16 conversion
// (exhaustive, and against the CPU's F16C where it has it), quantize/dequantize round trips within
// each format's error, the real llama.cpp fixtures (/work/shared/gguf: dequantized tensors against
// the same tensors in f32, and our quantizer's bytes against llama-quantize's), MatmulQuant on
// every ISA path against a double-precision product with the dequantized weights, and the
// errors a malformed matrix gets at creation.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/gguf/gguf.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/quant_dot.h"
#include "kernels/cpu/quant_gemm.h"
#include "kernels/cpu/quant_matrix.h"
#include "kernels/cpu/quant_types.h"
#include "tests/test_util.h"

namespace heavykv::cpu {
namespace {

// Relative RMS error ||a - b|| / ||b|| that each format must stay under on uniform data (the
// rounding step over sqrt(12), relative to the data's RMS, with some margin): a wrong bit
// placement or scale lands far above these.
double MaxRelRms(QuantType type) {
  switch (type) {
    case QuantType::kF32: return 0.0;
    case QuantType::kF16: return 3e-4;
    case QuantType::kBF16: return 2.5e-3;
    case QuantType::kQ8_0: return 0.006;
    case QuantType::kQ6_K: return 0.025;
    case QuantType::kQ5_0: return 0.045;
    case QuantType::kQ5_K: return 0.045;
    case QuantType::kQ4_0: return 0.085;
    case QuantType::kQ4_K: return 0.09;
    default: break;  // not one of kAllQuantTypes
  }
  ADD_FAILURE() << "no error bound for " << QuantTypeName(type);
  return 0.0;
}

double RelRms(const float* a, const float* b, int64_t count) {
  double err = 0, norm = 0;
  for (int64_t i = 0; i < count; ++i) {
    err += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    norm += double(b[i]) * b[i];
  }
  return norm == 0 ? std::sqrt(err) : std::sqrt(err / norm);
}

std::vector<float> Uniform(int64_t count, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(count);
  for (float& x : v) x = u(rng);
  return v;
}

TEST(QuantTypesTest, GeometryAndIdsAreGgmls) {
  struct Row {
    QuantType type;
    uint32_t id;
    int64_t elems, bytes;
    const char* name;
  };
  const Row rows[] = {
      {QuantType::kF32, 0, 1, 4, "f32"},        {QuantType::kF16, 1, 1, 2, "f16"},
      {QuantType::kBF16, 30, 1, 2, "bf16"},     {QuantType::kQ8_0, 8, 32, 34, "q8_0"},
      {QuantType::kQ4_0, 2, 32, 18, "q4_0"},    {QuantType::kQ5_0, 6, 32, 22, "q5_0"},
      {QuantType::kQ4_K, 12, 256, 144, "q4_K"}, {QuantType::kQ5_K, 13, 256, 176, "q5_K"},
      {QuantType::kQ6_K, 14, 256, 210, "q6_K"}};
  for (const Row& r : rows) {
    EXPECT_EQ(static_cast<uint32_t>(r.type), r.id);
    EXPECT_EQ(QuantBlockElems(r.type), r.elems) << r.name;
    EXPECT_EQ(QuantBlockBytes(r.type), r.bytes) << r.name;
    EXPECT_STREQ(QuantTypeName(r.type), r.name);
    auto t = QuantTypeFromGgmlId(r.id);
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(*t, r.type);
  }
  EXPECT_EQ(QuantRowBytes(QuantType::kQ4_K, 2048), 8 * 144);
  // Q4_1 (3) and IQ types exist in ggml but have no kernel here: a clear error, not a guess.
  for (uint32_t id : {3u, 7u, 10u, 11u, 16u, 99u}) {
    auto t = QuantTypeFromGgmlId(id);
    ASSERT_FALSE(t.ok()) << id;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(std::to_string(id)), std::string::npos);
  }
}

__attribute__((target("f16c"))) uint16_t HardwareFp16(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}

TEST(QuantTypesTest, Fp16ConversionsAreExact) {
  // Every fp16 value survives fp16 -> fp32 -> fp16 (NaNs stay NaN).
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = Fp16ToFloat(uint16_t(h));
    if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0) {
      ASSERT_TRUE(std::isnan(f)) << h;
      ASSERT_TRUE(std::isnan(Fp16ToFloat(FloatToFp16(f)))) << h;
    } else {
      ASSERT_EQ(FloatToFp16(f), h) << h;
    }
  }
  EXPECT_EQ(Fp16ToFloat(0x3C00), 1.0f);
  EXPECT_EQ(Fp16ToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(FloatToFp16(65520.0f), 0x7C00);               // halfway past the max: infinity
  EXPECT_EQ(FloatToFp16(65519.0f), 0x7BFF);
  // Rounding against the CPU's own conversion, over every magnitude fp16 covers and beyond.
  if (!HasF16c()) {
    std::printf("[ note ] this CPU has no F16C: fp16 rounding checked on round trips only\n");
    return;
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits(0, 0xFFFFFFFFu);
  int checked = 0;
  for (int i = 0; i < 2000000; ++i) {
    uint32_t u = bits(rng);
    // Exponents around fp16's range (2^-27 .. 2^17) get most of the samples.
    if (i % 4 != 0) u = (u & 0x807FFFFFu) | ((100u + (u >> 23) % 46) << 23);
    float f;
    std::memcpy(&f, &u, sizeof(f));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToFp16(f), HardwareFp16(f)) << f;
    ++checked;
  }
  EXPECT_GT(checked, 1000000);
}

TEST(QuantTypesTest, RoundTripsStayWithinEachFormatsError) {
  for (QuantType type : kAllQuantTypes) {
    SCOPED_TRACE(QuantTypeName(type));
    const int64_t k = 1024;
    std::vector<float> x = Uniform(k, 11);
    // Blocks with one large outlier and a constant sub-block: scale searches and min handling.
    x[5] = 9.0f;
    for (int i = 512; i < 544; ++i) x[i] = 0.3f;
    std::vector<uint8_t> q(QuantRowBytes(type, k));
    std::vector<float> back(k);
    QuantizeRow(type, x.data(), q.data(), k);
    DequantizeRow(type, q.data(), back.data(), k);
    std::vector<float> x_tail(x.begin() + 544, x.end()), back_tail(back.begin() + 544, back.end());
    // The uniform part (after the outlier's super-block).
    EXPECT_LE(RelRms(back_tail.data(), x_tail.data(), k - 544), MaxRelRms(type));
    EXPECT_LE(RelRms(back.data(), x.data(), k), 2 * MaxRelRms(type));
    // Zeros stay zeros (no division by a zero scale).
    std::vector<float> zeros(k, 0.0f);
    QuantizeRow(type, zeros.data(), q.data(), k);
    DequantizeRow(type, q.data(), back.data(), k);
    for (int64_t i = 0; i < k; ++i) ASSERT_EQ(back[i], 0.0f) << i;
  }
}

// The fixtures: GGUF files written by llama.cpp's llama-quantize from rl256-f32.gguf /
// s260-f32.gguf, copied into tests/data/gguf (its README), or ../shared/gguf beside the checkout.
std::string FixtureDir() {
  for (const std::string& dir : {heavykv::testing::SourcePath("tests/data/gguf"),
                                 heavykv::testing::SourcePath("../shared/gguf")}) {
    if (std::filesystem::exists(dir + "/rl256-f32.gguf")) return dir;
  }
  return {};
}

struct FixtureStats {
  int64_t tensors = 0, blocks = 0, blocks_identical = 0;
  double worst_rel_rms = 0;
};

// Every quantized tensor of `file` against the same tensor of `f32_file`: its dequantization
// within the format's error, and our quantizer's blocks against the file's.
// `slack` widens the error bound for trained weights, whose heavier tails than the uniform
// data MaxRelRms is calibrated on leave more error per RMS.
std::map<QuantType, FixtureStats> CompareFixture(const std::string& file,
                                                 const std::string& f32_file, double slack) {
  std::map<QuantType, FixtureStats> stats;
  absl::StatusOr<GgufFile> q = GgufFile::Open(file), f = GgufFile::Open(f32_file);
  EXPECT_TRUE(q.ok()) << q.status();
  EXPECT_TRUE(f.ok()) << f.status();
  if (!q.ok() || !f.ok()) return stats;
  for (const GgufTensor& t : q->tensors()) {
    const std::string name(t.name);
    auto type = QuantTypeFromGgmlId(static_cast<uint32_t>(t.type));
    if (!type.ok() || *type == QuantType::kF32) continue;
    const GgufTensor* ref = f->FindTensor(t.name);
    EXPECT_NE(ref, nullptr) << name;
    if (ref == nullptr) continue;
    EXPECT_EQ(ref->type, GgmlType::kF32);
    EXPECT_EQ(ref->dims, t.dims) << name;
    const int64_t k = t.dims[0], rows = t.num_elements / k, row_bytes = QuantRowBytes(*type, k);
    auto m = QuantMatrix::FromRows(*type, rows, k, t.data.data(), rows * row_bytes);
    EXPECT_TRUE(m.ok()) << name << ": " << m.status();
    if (!m.ok()) continue;
    const auto* w = reinterpret_cast<const float*>(ref->data.data());
    std::vector<float> row(k);
    std::vector<uint8_t> ours(row_bytes);
    FixtureStats& s = stats[*type];
    double err = 0, norm = 0;
    for (int64_t r = 0; r < rows; ++r) {
      m->DequantizeRowTo(r, row.data());
      for (int64_t i = 0; i < k; ++i) {
        err += (double(row[i]) - w[r * k + i]) * (double(row[i]) - w[r * k + i]);
        norm += double(w[r * k + i]) * w[r * k + i];
      }
      QuantizeRow(*type, w + r * k, ours.data(), k);
      const int64_t bb = QuantBlockBytes(*type);
      for (int64_t b = 0; b < row_bytes / bb; ++b) {
        ++s.blocks;
        s.blocks_identical += std::memcmp(ours.data() + b * bb, m->row(r) + b * bb, bb) == 0;
      }
    }
    const double rel = std::sqrt(err / norm);
    EXPECT_LE(rel, slack * MaxRelRms(*type)) << name << " (" << QuantTypeName(*type) << ")";
    s.worst_rel_rms = std::max(s.worst_rel_rms, rel);
    ++s.tensors;
  }
  for (const auto& [type, s] : stats) {
    std::printf(
        "[ fixture ] %-20s %-5s tensors %2lld  blocks %7lld  identical to llama-quantize "
        "%7lld (%.4f%%)  dequant rel rms %.5f\n",
        std::filesystem::path(file).filename().c_str(), QuantTypeName(type),
        static_cast<long long>(s.tensors), static_cast<long long>(s.blocks),
        static_cast<long long>(s.blocks_identical),
        100.0 * double(s.blocks_identical) / double(s.blocks), s.worst_rel_rms);
  }
  return stats;
}

TEST(QuantFixtureTest, LlamaCppFilesDequantizeAndRequantizeAsLlamaQuantizeDid) {
  const std::string dir = FixtureDir();
  if (dir.empty()) GTEST_FAIL() << "no GGUF fixtures in tests/data/gguf";
  struct Case {
    const char* file;
    const char* f32;
    std::vector<QuantType> expected;  // types the file must hold
    double slack = 1.0;
  };
  const Case cases[] = {
      {"rl256-q8_0.gguf", "rl256-f32.gguf", {QuantType::kQ8_0}},
      {"rl256-q4_0.gguf", "rl256-f32.gguf", {QuantType::kQ4_0, QuantType::kQ6_K}},
      {"rl256-q4_k_m.gguf", "rl256-f32.gguf", {QuantType::kQ4_K, QuantType::kQ6_K}},
      {"rl256-q5_k_m.gguf", "rl256-f32.gguf", {QuantType::kQ5_K, QuantType::kQ6_K}},
      {"rl256-q6_k.gguf", "rl256-f32.gguf", {QuantType::kQ6_K}},
      {"rl256-f16.gguf", "rl256-f32.gguf", {QuantType::kF16}},
      {"rl256-bf16.gguf", "rl256-f32.gguf", {QuantType::kBF16}},
      {"s260-q4_k_m.gguf",
       "s260-f32.gguf",
       {QuantType::kQ5_0, QuantType::kQ8_0, QuantType::kF16},
       1.25},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file);
    // F16 and BF16 (3.5 MB each) are not copied into the repo: read from ../shared when there.
    std::string at = dir;
    if (!std::filesystem::exists(at + "/" + c.file))
      at = heavykv::testing::SourcePath("../shared/gguf");
    if (!std::filesystem::exists(at + "/" + c.file)) {
      std::printf("[ note ] %s is not here (../shared/gguf): not compared\n", c.file);
      continue;
    }
    const auto stats = CompareFixture(at + "/" + c.file, at + "/" + c.f32, c.slack);
    for (QuantType type : c.expected) {
      const auto it = stats.find(type);
      ASSERT_NE(it, stats.end()) << "no " << QuantTypeName(type) << " tensor";
      const FixtureStats& s = it->second;
      // Our quantizer reproduces llama-quantize's bytes (see the printed table).
      EXPECT_EQ(s.blocks_identical, s.blocks) << QuantTypeName(type);
    }
  }
}

void CheckMatmul(QuantType type, Isa isa, int64_t m, int64_t n, int64_t k, bool accumulate,
                 int threads) {
  SCOPED_TRACE(::testing::Message()
               << QuantTypeName(type) << " isa=" << IsaName(isa) << " m=" << m << " n=" << n
               << " k=" << k << " acc=" << accumulate << " threads=" << threads);
  SetNumThreads(threads);
  const std::vector<float> w = Uniform(n * k, uint32_t(n * 7 + k)), x = Uniform(m * k, uint32_t(m));
  const std::vector<float> y0 = Uniform(m * n, 3);
  auto q = QuantMatrix::Quantize(type, w.data(), n, k);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->bytes(), n * QuantRowBytes(type, k));
  std::vector<float> wdq(n * k);
  for (int64_t r = 0; r < n; ++r) q->DequantizeRowTo(r, wdq.data() + r * k);
  const int64_t ldy = n + 5;  // outputs past column n must stay untouched
  std::vector<float> y(m * ldy, 7.0f);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) y[i * ldy + j] = y0[i * n + j];
  }
  MatmulQuantWith(isa, x.data(), *q, y.data(), m, ldy, accumulate, QuantPath::kFp32);
  const std::vector<double> ref =
      testing::ReferenceMatmul(x, wdq, accumulate ? y0 : std::vector<float>{}, m, n, k);
  double err = 0, norm = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const double d = y[i * ldy + j] - ref[i * n + j];
      err += d * d;
      norm += ref[i * n + j] * ref[i * n + j];
    }
    for (int64_t j = n; j < ldy; ++j) ASSERT_EQ(y[i * ldy + j], 7.0f) << "wrote past column n";
  }
  EXPECT_LT(std::sqrt(err / norm), 2e-6);
}

// The int8 path against a double-precision product with the dequantized weights. Its error is
// the activations' rounding: input i of row r becomes a multiple of its block's step
// s_i = amax(block) / 127 (blocks of 32 inputs, 256 for the K-quants), off by at most s_i / 2, so
// output (r, j) is off by
//   at most  B = sum_i |w_ji| s_i / 2           (every rounding at its worst: asserted per output)
//   about    V = sum_i w_ji^2 s_i^2 / 12        (roundings uniform and independent: the summed
//                                                squared error over all outputs is asserted below
//                                                2 x the summed V, and 1.05 x the right answer,
//                                                a 5% scale error, is checked to fail that bound)
// plus fp32 accumulation, 1e-5 of sum_i |w_ji x_i|. Returns the summed squared error / summed V.
double CheckInt8Matmul(QuantType type, Isa isa, int64_t m, int64_t n, int64_t k, bool accumulate,
                       int threads, uint32_t seed = 1) {
  SCOPED_TRACE(::testing::Message()
               << "int8 " << QuantTypeName(type) << " isa=" << IsaName(isa) << " m=" << m
               << " n=" << n << " k=" << k << " acc=" << accumulate << " threads=" << threads);
  SetNumThreads(threads);
  const std::vector<float> w = Uniform(n * k, seed * 7 + uint32_t(n + k));
  std::vector<float> x = Uniform(m * k, seed + uint32_t(m));
  for (int64_t i = 0; i < m * k; i += 97) x[i] *= 6.0f;  // blocks of different scales
  const std::vector<float> y0 = Uniform(m * n, 3);
  auto q = QuantMatrix::Quantize(type, w.data(), n, k);
  EXPECT_TRUE(q.ok()) << q.status();
  if (!q.ok()) return 0;
  std::vector<float> wdq(n * k), step(m * k);
  for (int64_t r = 0; r < n; ++r) q->DequantizeRowTo(r, wdq.data() + r * k);
  const int64_t act_block = internal::Int8ActBlock(type);  // 32, or 256 for the K-quants
  for (int64_t b = 0; b < m * k / act_block; ++b) {
    float amax = 0;
    for (int64_t j = 0; j < act_block; ++j) amax = std::max(amax, std::fabs(x[act_block * b + j]));
    for (int64_t j = 0; j < act_block; ++j) step[act_block * b + j] = amax / 127;
  }
  const int64_t ldy = n + 3;
  std::vector<float> y(m * ldy, 7.0f);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) y[i * ldy + j] = y0[i * n + j];
  }
  MatmulQuantWith(isa, x.data(), *q, y.data(), m, ldy, accumulate, QuantPath::kInt8);
  const std::vector<double> ref =
      testing::ReferenceMatmul(x, wdq, accumulate ? y0 : std::vector<float>{}, m, n, k);
  double err2 = 0, var = 0, err2_scaled = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double bound = 0, v = 0, mag = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double wv = wdq[j * k + kk], s = step[i * k + kk];
        bound += std::fabs(wv) * s / 2;
        v += wv * wv * s * s / 12;
        mag += std::fabs(wv * x[i * k + kk]);
      }
      const double d = y[i * ldy + j] - ref[i * n + j];
      EXPECT_LE(std::fabs(d), bound + 1e-5 * mag) << "output " << i << "," << j;
      err2 += d * d;
      var += v;
      const double base = accumulate ? y0[i * n + j] : 0.0;
      const double wrong = base + 1.05 * (y[i * ldy + j] - base) - ref[i * n + j];
      err2_scaled += wrong * wrong;
    }
    for (int64_t j = n; j < ldy; ++j) EXPECT_EQ(y[i * ldy + j], 7.0f) << "wrote past column n";
  }
  EXPECT_LT(err2, 2 * var);
  EXPECT_GT(err2_scaled, 2 * var) << "the bound would not see a 5% scale error";
  return err2 / var;
}

TEST(QuantGemmTest, Int8PathIsWithinTheActivationRoundingOnEveryIsa) {
  for (Isa isa : heavykv::testing::IsasToTest()) {
    for (QuantType type : kAllQuantTypes) {
      if (!internal::HasInt8Dot(type)) continue;
      const int64_t block = QuantBlockElems(type);
      // m: one decode, odd and blocked batches; n = 37: a partial block of 16 rows and a partial
      // tile of 4; k: several blocks, and past one slice (kDotSlice) at m > 4.
      for (int64_t m : {1, 3, 6, 33}) {
        const double ratio =
            CheckInt8Matmul(type, isa, m, 37, block == 256 ? 768 : 608, m % 2 == 1, 1);
        if (m == 33) {
          std::printf("[ int8 ] %-4s %-8s squared error / its expectation %.3f\n",
                      QuantTypeName(type), IsaName(isa), ratio);
        }
      }
      CheckInt8Matmul(type, isa, 9, 70, 2304, true, 2);
      CheckInt8Matmul(type, isa, 2, 37, 1024, false, 1);  // whole 256-input runs: fused decoders
    }
    CheckInt8Matmul(QuantType::kQ4_K, isa, 32, 300, 2048, false, 2);
  }
}

// Activations that 8 bits hold exactly (integers with each 32-block reaching +-127, so its
// scale is 1): the int8 path must then give the fp32 product with the dequantized weights to
// fp32 rounding, which a misplaced bit, scale or offset anywhere would break.
TEST(QuantGemmTest, Int8PathIsExactOnActivationsThatAreInt8) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> level(-127, 127);
  for (Isa isa : heavykv::testing::IsasToTest()) {
    for (QuantType type : kAllQuantTypes) {
      if (!internal::HasInt8Dot(type)) continue;
      SCOPED_TRACE(::testing::Message() << QuantTypeName(type) << " isa=" << IsaName(isa));
      // m = 3 for the whole-row (and, for Q4_K on AVX-512, fused) path, 5 for the sliced one.
      for (int64_t m : {3, 5}) {
        const int64_t n = 21, k = 1280;
        std::vector<float> x(m * k);
        for (int64_t i = 0; i < m * k; ++i)
          x[i] = float(i % 32 == 7 ? (i % 64 ? 127 : -127) : level(rng));
        const std::vector<float> w = Uniform(n * k, 9);
        auto q = QuantMatrix::Quantize(type, w.data(), n, k);
        ASSERT_TRUE(q.ok());
        std::vector<float> wdq(n * k), y(m * n);
        for (int64_t r = 0; r < n; ++r) q->DequantizeRowTo(r, wdq.data() + r * k);
        MatmulQuantWith(isa, x.data(), *q, y.data(), m, n, false, QuantPath::kInt8);
        const std::vector<double> ref = testing::ReferenceMatmul(x, wdq, {}, m, n, k);
        for (int64_t i = 0; i < m * n; ++i) {
          double mag = 0;
          for (int64_t kk = 0; kk < k; ++kk)
            mag += std::fabs(double(wdq[(i % n) * k + kk]) * x[(i / n) * k + kk]);
          ASSERT_NEAR(y[i], ref[i], 2e-6 * mag) << i;
        }
      }
    }
  }
}

// Every dot kernel this CPU runs (AVX-512 with and without VNNI included) against the portable
// one on the same unpacked tile, levels and activations at their extremes: 255 * -127 pairs
// would saturate maddubs' 16 bits if the Q8_0 (signed_levels) handling were wrong.
TEST(QuantGemmTest, DotKernelsAgreeWithThePortableOne) {
  struct Kernel {
    const char* name;
    void (*fn)(const internal::DotTile&);
    void (*permute)(uint8_t*, int64_t);
    bool supported;
  };
  const bool avx2 = IsaSupported(Isa::kAvx2);
  const bool bw = IsaSupported(Isa::kAvx512) && __builtin_cpu_supports("avx512bw");
  const Kernel kernels[] = {
      {"avx2", internal::DotTileAvx2, internal::PermuteLevelsAvx2, avx2},
      {"avxvnni", internal::DotTileAvxVnni, internal::PermuteLevelsAvx2,
       avx2 && internal::HasAvxVnni()},
      {"avx512", internal::DotTileAvx512, internal::PermuteLevelsAvx512, bw},
      {"avx512vnni", internal::DotTileAvx512Vnni, internal::PermuteLevelsAvx512,
       bw && internal::HasAvx512Vnni()},
  };
  std::mt19937 rng(3);
  const int64_t len = 768, nc = 7, nr = 4;
  for (bool block256 : {false, true}) {
    for (bool signed_levels : {false, true}) {
      std::vector<uint8_t> lv(nr * len);
      std::vector<float> wsc(nr * len / 16), wmn(nr * len / 16);
      std::vector<int8_t> qs(nc * len);
      std::vector<float> scale(nc * len / 16), sum(nc * len / 16);
      for (size_t i = 0; i < lv.size(); ++i) {
        // Q8_0's levels span 1..255 (int8 + 128); the others stay below 64.
        lv[i] = signed_levels ? uint8_t(i % 5 == 0   ? 255
                                        : i % 5 == 1 ? 1
                                                     : rng() % 256)
                              : uint8_t(i % 3 == 0 ? 63 : rng() % 64);
      }
      for (size_t i = 0; i < qs.size(); ++i) qs[i] = int8_t(i % 2 ? -127 : int(rng() % 255) - 127);
      // Q8_0's scale is one per block of 32, which the signed detour (no offset term) relies on.
      for (size_t h = 0; h < wsc.size(); ++h) {
        wsc[h] = signed_levels && h % 2 ? wsc[h - 1] : 0.001f * float(1 + rng() % 100);
        wmn[h] = signed_levels ? 128 * wsc[h] : 0.01f * float(rng() % 10);
      }
      for (int64_t h = 0; h < nc * len / 16; ++h) {
        // One step per 256 inputs, or per 32.
        scale[h] = 0.01f * float(1 + (block256 ? h / 16 : h / 2) % 10);
        int s = 0;
        for (int j = 0; j < 16; ++j) s += qs[16 * h + j];
        sum[h] = scale[h] * float(s);
      }
      for (int tile_rows = 1; tile_rows <= nr; ++tile_rows) {
        internal::DotTile t;
        t.nr = tile_rows;
        t.scale = scale.data();
        t.sum = sum.data();
        t.qs_stride = len;
        t.f_stride = len / 16;
        t.nc = int(nc);
        t.len = len;
        t.signed_levels = signed_levels;
        t.ldo = nc;
        std::vector<float> want(nr * nc), got(nr * nc);
        internal::UnpackedSlice w[nr];
        for (int r = 0; r < nr; ++r) {
          w[r] = {lv.data() + r * len, wsc.data() + r * len / 16, wmn.data() + r * len / 16};
        }
        t.w = w;
        t.qs = qs.data();
        t.out = want.data();
        internal::DotTilePortable(t);
        for (const Kernel& kernel : kernels) {
          if (!kernel.supported) continue;
          SCOPED_TRACE(::testing::Message() << kernel.name << " signed=" << signed_levels
                                            << " block256=" << block256 << " rows=" << tile_rows);
          // The same numbers in the order this kernel reads them.
          std::vector<uint8_t> lv_p = lv;
          std::vector<int8_t> qs_p = qs;
          for (int r = 0; r < nr; ++r) kernel.permute(lv_p.data() + r * len, len);
          for (int c = 0; c < nc; ++c) {
            kernel.permute(reinterpret_cast<uint8_t*>(qs_p.data()) + c * len, len);
          }
          internal::UnpackedSlice wp[nr];
          for (int r = 0; r < nr; ++r) wp[r] = {lv_p.data() + r * len, w[r].wsc, w[r].wmn};
          internal::DotTile tp = t;
          tp.w = wp;
          tp.qs = qs_p.data();
          std::fill(got.begin(), got.end(), 0.0f);
          tp.out = got.data();
          kernel.fn(tp);
          for (int64_t i = 0; i < tile_rows * nc; ++i) {
            // fp32 summation order: relative to the terms' magnitudes (Q8_0's + 128 and its
            // offset term cancel), not to their sum.
            const int64_t r = i / nc, col = i % nc;
            double mag = 0;
            for (int64_t e = 0; e < len; ++e) {
              mag += std::fabs(double(wsc[(r * len + e) / 16]) * scale[(col * len + e) / 16] *
                               lv[r * len + e] * qs[col * len + e]);
            }
            for (int64_t h = 0; h < len / 16; ++h) {
              mag += std::fabs(double(wmn[r * len / 16 + h]) * sum[col * len / 16 + h]);
            }
            ASSERT_NEAR(got[i], want[i], 1e-6 * mag) << i;
          }
        }
      }
    }
  }
}

// The team form, called by both threads of a parallel region (two parts of one output, as a
// fused Linear), gives MatmulQuant's outputs bit for bit on every ISA, accumulating or not.
TEST(QuantGemmTest, TeamFormEqualsMatmulQuant) {
  for (Isa isa : heavykv::testing::IsasToTest()) {
    for (QuantType type : kAllQuantTypes) {
      if (!QuantUsesInt8(type, 1)) continue;
      for (int64_t m : {1, 3}) {
        SCOPED_TRACE(::testing::Message() << QuantTypeName(type) << " " << IsaName(isa) << " m "
                                          << m);
        const int64_t n = 300, k = 512;  // 19 blocks of 16 rows: a partial block at the end
        std::vector<float> w = Uniform(n * k, 41), x = Uniform(m * k, 42);
        auto q = QuantMatrix::Quantize(type, w.data(), n, k);
        ASSERT_TRUE(q.ok());
        std::vector<float> want(m * 2 * n, 0.5f), got(m * 2 * n, 0.5f);
        for (bool accumulate : {false, true}) {
          for (int part = 0; part < 2; ++part) {
            MatmulQuantWith(isa, x.data(), *q, want.data() + part * n, m, 2 * n, accumulate);
          }
#pragma omp parallel num_threads(2)
          {
            for (int part = 0; part < 2; ++part) {
              MatmulQuantTeamWith(isa, x.data(), *q, got.data() + part * n, m, 2 * n, accumulate);
            }
          }
          ASSERT_EQ(want, got) << (accumulate ? "accumulating" : "writing");
        }
      }
    }
  }
}

// The fused decoders (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K rows read straight from their blocks: the
// 512-bit ones for m <= 4, the 256-bit ones, without Q5_K, for m = 1), with and without VNNI,
// against the portable int8 path on the same activations.
TEST(QuantGemmTest, FusedDecodersAgreeWithThePortablePath) {
  const bool bw = IsaSupported(Isa::kAvx512) && __builtin_cpu_supports("avx512bw");
  const bool avx2 = IsaSupported(Isa::kAvx2);
  struct Fused {
    const char* name;
    bool (*fn)(int, const internal::FusedRows&);
    bool supported;
    void (*permute)(uint8_t*, int64_t);
    int64_t max_m;
  };
  const Fused fused[] = {
      {"avx512", internal::FusedRowsAvx512, bw, internal::PermuteLevelsAvx512, 6},
      {"avx512vnni", internal::FusedRowsAvx512Vnni, bw && internal::HasAvx512Vnni(),
       internal::PermuteLevelsAvx512, 6},
      {"avx2", internal::FusedRowsAvx2, avx2, internal::PermuteLevelsAvx2, 1},
      {"avxvnni", internal::FusedRowsAvxVnni, avx2 && internal::HasAvxVnni(),
       internal::PermuteLevelsAvx2, 1}};
  if (!avx2) GTEST_SKIP() << "no AVX2";
  // m = 1: a batch-1 decode's own loop; m = 6: two groups of activation rows (4 + 2).
  const int64_t n = 5, k = 768;
  for (const int64_t m : {1, 6}) {
    for (QuantType type : {QuantType::kQ4_K, QuantType::kQ6_K, QuantType::kQ8_0,
                           QuantType::kQ4_0, QuantType::kQ5_K}) {
      std::vector<float> w = Uniform(n * k, 31), x = Uniform(m * k, 32);
      w[7] = -30.0f;  // a large scale and a negative Q6_K sub-block scale nearby
      auto q = QuantMatrix::Quantize(type, w.data(), n, k);
      ASSERT_TRUE(q.ok());
      std::vector<float> want(m * n);
      MatmulQuantWith(Isa::kPortable, x.data(), *q, want.data(), m, n, false, QuantPath::kInt8);
      for (const Fused& fu : fused) {
        if (!fu.supported || m > fu.max_m) continue;
        SCOPED_TRACE(::testing::Message() << QuantTypeName(type) << " " << fu.name << " m " << m);
        // The activations as the kernel reads them.
        std::vector<int8_t> qs(m * k);
        std::vector<float> scale(m * k / 16), sum(m * k / 16);
        internal::QuantActs a;
        a.m = m;
        a.k = a.kp = k;
        a.block = internal::Int8ActBlock(type);
        a.qs = qs.data();
        a.scale = scale.data();
        a.sum = sum.data();
        internal::QuantizeActRows(x.data(), 0, m, a);
        for (int64_t i = 0; i < m; ++i) {
          fu.permute(reinterpret_cast<uint8_t*>(qs.data()) + i * k, k);
        }
        std::vector<const uint8_t*> rows(n);
        for (int64_t r = 0; r < n; ++r) rows[r] = q->row(r);
        std::vector<float> got(n * m);  // [n][m]
        internal::FusedRows f{rows.data(), int(n), k / 256,    qs.data(), scale.data(), sum.data(),
                              k,           k / 16, int(m),     got.data(), m};
        ASSERT_TRUE(fu.fn(static_cast<int>(type), f));
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t r = 0; r < n; ++r) {
            ASSERT_NEAR(got[r * m + i], want[i * n + r], 1e-4 * (1 + std::fabs(want[i * n + r])))
                << "row " << r << " act " << i;
          }
        }
        if (fu.max_m == 1) {  // more activation rows are refused, nothing written
          internal::FusedRows two = f;
          two.nc = 2;
          EXPECT_FALSE(fu.fn(static_cast<int>(type), two));
        }
      }
    }
  }
  if (bw) {
    EXPECT_FALSE(
        internal::FusedRowsAvx512(static_cast<int>(QuantType::kQ5_0), internal::FusedRows{}));
  }
  internal::FusedRows one{};
  one.nc = 1;
  EXPECT_FALSE(internal::FusedRowsAvx2(static_cast<int>(QuantType::kQ5_0), one));
}

// The permutations move 4-byte words exactly as documented (quant_dot_kernel.h).
TEST(QuantGemmTest, LevelPermutationsAreTheDocumentedTransposes) {
  struct Perm {
    void (*fn)(uint8_t*, int64_t);
    int64_t lanes;
    bool supported;
  };
  const Perm perms[] = {{internal::PermuteLevelsAvx2, 8, IsaSupported(Isa::kAvx2)},
                        {internal::PermuteLevelsAvx512, 16, IsaSupported(Isa::kAvx512)}};
  for (const Perm& p : perms) {
    if (!p.supported) continue;
    std::vector<uint8_t> v(512);
    for (size_t i = 0; i < v.size(); ++i) v[i] = uint8_t(i * 7 + i / 256);
    std::vector<uint8_t> out = v;
    p.fn(out.data(), int64_t(out.size()));
    const int64_t run = 16 * p.lanes;  // bytes per super-chunk
    for (int64_t s = 0; s < int64_t(v.size()); s += run) {
      for (int64_t l = 0; l < p.lanes; ++l) {
        for (int k = 0; k < 4; ++k) {
          for (int b = 0; b < 4; ++b) {
            ASSERT_EQ(out[s + 4 * (k * p.lanes + l) + b], v[s + 4 * (4 * l + k) + b])
                << "lanes " << p.lanes << " l " << l << " k " << k;
          }
        }
      }
    }
  }
}

// MatmulQuant takes the int8 path for the block formats at any m and fp32 for F16 / BF16 / F32:
// bit for bit what the explicit paths give.
TEST(QuantGemmTest, AutoFollowsThePathRule) {
  SetNumThreads(1);
  const int64_t n = 40, k = 512;
  for (QuantType type : {QuantType::kQ4_K, QuantType::kQ8_0, QuantType::kF16}) {
    const std::vector<float> w = Uniform(n * k, 1);
    auto q = QuantMatrix::Quantize(type, w.data(), n, k);
    ASSERT_TRUE(q.ok());
    for (int64_t m : {1, 48, 100}) {
      SCOPED_TRACE(::testing::Message() << QuantTypeName(type) << " m=" << m);
      const std::vector<float> x = Uniform(m * k, 2);
      std::vector<float> got(m * n), want(m * n);
      MatmulQuant(x.data(), *q, got.data(), m, n, false);
      const bool int8 = type != QuantType::kF16;
      EXPECT_EQ(QuantUsesInt8(type, m), int8);
      MatmulQuantWith(BestIsa(), x.data(), *q, want.data(), m, n, false,
                      int8 ? QuantPath::kInt8 : QuantPath::kFp32);
      for (int64_t i = 0; i < m * n; ++i) ASSERT_EQ(got[i], want[i]) << i;
    }
  }
}

// The portable and vector int8 paths quantize activations with the same code and take exact
// integer dots, so they differ by fp32 summation order only.
TEST(QuantGemmTest, Int8PathsAgreeAcrossIsas) {
  for (QuantType type : kAllQuantTypes) {
    if (!internal::HasInt8Dot(type)) continue;
    SCOPED_TRACE(QuantTypeName(type));
    const int64_t m = 7, n = 50, k = 1536;
    const std::vector<float> w = Uniform(n * k, 21), x = Uniform(m * k, 22);
    auto q = QuantMatrix::Quantize(type, w.data(), n, k);
    ASSERT_TRUE(q.ok());
    std::vector<float> want(m * n), got(m * n);
    MatmulQuantWith(Isa::kPortable, x.data(), *q, want.data(), m, n, false, QuantPath::kInt8);
    for (Isa isa : heavykv::testing::IsasToTest()) {
      MatmulQuantWith(isa, x.data(), *q, got.data(), m, n, false, QuantPath::kInt8);
      for (int64_t i = 0; i < m * n; ++i) {
        ASSERT_NEAR(got[i], want[i], 2e-5f * (1.0f + std::fabs(want[i])))
            << IsaName(isa) << " " << i;
      }
    }
  }
}

// k per type: not a multiple of the AVX2 kernel's 512-input chunk nor of 16 where the block allows.
int64_t TestK(QuantType type) {
  const int64_t block = QuantBlockElems(type);
  return block == 256 ? 768 : block == 32 ? 608 : 601;
}

TEST(QuantGemmTest, MatchesDequantizedProductOnEveryIsa) {
  for (Isa isa : heavykv::testing::IsasToTest()) {
    for (QuantType type : kAllQuantTypes) {
      // m: one decode, the row path's widest, the panel path's tails, a decode batch, a prefill.
      for (int64_t m : {1, 2, 3, 4, 7, 32, 100}) {
        // n = 100: two whole panels and a partial one of 4 rows (a partial group of 8).
        CheckMatmul(type, isa, m, 100, TestK(type), m % 2 == 0, m == 32 ? 2 : 1);
      }
    }
    // Big enough to split over two threads, on both paths.
    CheckMatmul(QuantType::kQ4_K, isa, 32, 300, 1024, true, 2);
    CheckMatmul(QuantType::kQ8_0, isa, 2, 1000, 2048, false, 2);
    CheckMatmul(QuantType::kQ6_K, isa, 7, 50, 256, false, 2);
  }
}

TEST(QuantGemmTest, VectorDequantizersMatchThePortableOnes) {
  for (Isa isa : heavykv::testing::IsasToTest()) {
    for (QuantType type : kAllQuantTypes) {
      SCOPED_TRACE(::testing::Message() << QuantTypeName(type) << " isa=" << IsaName(isa));
      const int64_t n = 9, k = TestK(type);
      std::vector<float> w = Uniform(n * k, 5);
      w[3] = -40.0f;  // an outlier block
      auto q = QuantMatrix::Quantize(type, w.data(), n, k);
      ASSERT_TRUE(q.ok());
      std::vector<float> a(k), b(k);
      for (int64_t r = 0; r < n; ++r) {
        q->DequantizeRowTo(r, a.data());
        DequantizeRowWith(isa, *q, r, b.data());
        for (int64_t i = 0; i < k; ++i) {
          // Q4_K / Q5_K compute d * q - m, which an FMA may round once instead of twice.
          ASSERT_NEAR(b[i], a[i], 1e-6f * (1.0f + std::fabs(a[i]))) << "row " << r << " elem " << i;
        }
      }
    }
  }
}

TEST(QuantMatrixTest, BadShapesAreErrorsAtCreation) {
  const std::vector<float> w(4 * 512, 0.5f);
  std::vector<uint8_t> bytes(4 * QuantRowBytes(QuantType::kQ4_K, 512));
  // k not a whole number of blocks.
  auto a = QuantMatrix::FromRows(QuantType::kQ4_K, 4, 300, bytes.data(), int64_t(bytes.size()));
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("256"), std::string::npos) << a.status();
  EXPECT_NE(a.status().message().find("300"), std::string::npos) << a.status();
  auto b = QuantMatrix::Quantize(QuantType::kQ8_0, w.data(), 4, 40);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  // The byte count must be exactly n rows.
  auto c = QuantMatrix::FromRows(QuantType::kQ4_K, 4, 512, bytes.data(), int64_t(bytes.size()) - 1);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("bytes"), std::string::npos) << c.status();
  // No rows or columns.
  EXPECT_FALSE(QuantMatrix::FromRows(QuantType::kQ8_0, 0, 32, bytes.data(), 0).ok());
  EXPECT_FALSE(QuantMatrix::Quantize(QuantType::kF16, w.data(), 4, 0).ok());
  // The right shape is accepted and keeps the bytes as given (no repack, no fp32 copy).
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i * 31);
  auto d = QuantMatrix::FromRows(QuantType::kQ4_K, 4, 512, bytes.data(), int64_t(bytes.size()));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->bytes(), int64_t(bytes.size()));
  EXPECT_EQ(std::memcmp(d->row(0), bytes.data(), bytes.size()), 0);
  EXPECT_EQ(std::memcmp(d->row(3), bytes.data() + 3 * d->row_bytes(), d->row_bytes()), 0);
}

}  // namespace
}  // namespace heavykv::cpu
