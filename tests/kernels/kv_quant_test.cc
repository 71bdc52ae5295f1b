// The quantized K/V row formats (kernels/kv_quant.h): int8 with the smallest power-of-two scale
// that holds the row, int4 in Q4_0-style groups with a least-squares choice of scale; the error
// bounds they promise, the nibble layout the SIMD attention paths read, and element reads equal
// to whole-row reads.
#include "kernels/kv_quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace heavykv {
namespace {

std::vector<float> RandomRow(int32_t hd, float mag, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, mag);
  std::vector<float> x(hd);
  for (float& v : x) v = normal(rng);
  return x;
}

TEST(KvQuantTest, Int8TakesTheSmallestPowerOfTwoScaleAndHalfAStepOfError) {
  for (int32_t hd : {8, 64, 128}) {
    for (float mag : {1e-6f, 0.01f, 1.0f, 300.0f}) {
      const std::vector<float> x = RandomRow(hd, mag, hd + static_cast<uint32_t>(mag * 1000));
      std::vector<uint8_t> data(hd);
      uint8_t e = 0;
      QuantizeKvRow(KvQuant::kInt8, x.data(), hd, data.data(), &e);
      float amax = 0.0f;
      for (float v : x) amax = std::max(amax, std::fabs(v));
      const float scale = E8m0ToFloat(e);
      EXPECT_EQ(scale, std::ldexp(1.0f, int(e) - 127));
      EXPECT_LE(amax / scale, 127.0f) << "hd " << hd << " mag " << mag;
      EXPECT_GT(amax / (scale / 2), 127.0f) << "not the smallest scale: hd " << hd;
      std::vector<float> y(hd);
      DequantizeKvRow(KvQuant::kInt8, data.data(), &e, hd, y.data());
      for (int32_t d = 0; d < hd; ++d) {
        EXPECT_LE(std::fabs(y[d] - x[d]), scale / 2) << d;
        EXPECT_EQ(DequantKvElem(KvQuant::kInt8, data.data(), &e, hd, d), y[d]);
      }
    }
  }
}

TEST(KvQuantTest, Int4GroupsHoldNibblePairsAndTheirFp16Scales) {
  for (int32_t hd : {8, 48, 64, 128}) {
    const int32_t g = Int4Group(hd);
    EXPECT_EQ(g, hd % 32 == 0 ? 32 : hd);
    const std::vector<float> x = RandomRow(hd, 2.0f, hd);
    std::vector<uint8_t> data(KvQuantDataBytes(KvQuant::kInt4, hd));
    std::vector<uint8_t> scale(KvQuantScaleBytes(KvQuant::kInt4, hd));
    ASSERT_EQ(data.size(), size_t(hd / 2));
    ASSERT_EQ(scale.size(), size_t(2 * hd / g));
    QuantizeKvRow(KvQuant::kInt4, x.data(), hd, data.data(), scale.data());
    std::vector<float> y(hd);
    DequantizeKvRow(KvQuant::kInt4, data.data(), scale.data(), hd, y.data());
    for (int32_t k = 0; k < hd / g; ++k) {
      uint16_t h;
      std::memcpy(&h, &scale[2 * k], 2);
      const float d = Fp16ToFloat(h);
      // d = m / -t (rounded to fp16) for the element m of largest magnitude and some t in
      // [6, 10] by halves: the one with the least squared error, so never more than Q4_0's t = 8.
      float m = 0.0f;
      for (int32_t j = 0; j < g; ++j) {
        if (std::fabs(x[k * g + j]) > std::fabs(m)) m = x[k * g + j];
      }
      bool candidate = false;
      for (float t = 6.0f; t <= 10.0f; t += 0.5f) candidate |= h == FloatToFp16(m / -t);
      EXPECT_TRUE(candidate) << "scale " << d << " for m " << m;
      const float d8 = Fp16ToFloat(FloatToFp16(m / -8.0f));
      double sse = 0, sse8 = 0;
      for (int32_t j = 0; j < g; ++j) {
        const int32_t i = k * g + j;
        // Byte j % (g/2) of the group: element j low, element j + g/2 high.
        const uint8_t byte = data[k * g / 2 + j % (g / 2)];
        const int32_t nib = j < g / 2 ? (byte & 0x0F) : (byte >> 4);
        EXPECT_EQ(y[i], float(nib - 8) * d);
        EXPECT_EQ(DequantKvElem(KvQuant::kInt4, data.data(), scale.data(), hd, i), y[i]);
        sse += std::pow(double(y[i]) - x[i], 2);
        const float q8 = std::fmax(-8.0f, std::fmin(7.0f, std::nearbyint(x[i] / d8)));
        sse8 += std::pow(double(q8 * d8) - x[i], 2);
      }
      EXPECT_LE(sse, sse8 * (1 + 1e-5)) << "hd " << hd << " group " << k;
    }
  }
}

TEST(KvQuantTest, ZeroRowsStayZeroAndOddHeadDimsAreRefusedForInt4) {
  std::vector<float> x(32, 0.0f), y(32, 1.0f);
  std::vector<uint8_t> data(32), scale(2);
  for (KvQuant q : {KvQuant::kInt8, KvQuant::kInt4}) {
    QuantizeKvRow(q, x.data(), 32, data.data(), scale.data());
    DequantizeKvRow(q, data.data(), scale.data(), 32, y.data());
    for (float v : y) EXPECT_EQ(v, 0.0f);
  }
  // A non-finite value (a broken activation) quantizes to a bound, not to undefined behaviour.
  std::vector<float> bad(32, 1.0f);
  bad[3] = std::nanf("");
  bad[4] = INFINITY;
  for (KvQuant q : {KvQuant::kInt8, KvQuant::kInt4}) {
    QuantizeKvRow(q, bad.data(), 32, data.data(), scale.data());
    DequantizeKvRow(q, data.data(), scale.data(), 32, y.data());
  }
  EXPECT_TRUE(KvQuantTakes(KvQuant::kInt8, 5));
  EXPECT_FALSE(KvQuantTakes(KvQuant::kInt4, 5));
  EXPECT_TRUE(KvQuantTakes(KvQuant::kInt4, 6));
}

}  // namespace
}  // namespace heavykv
