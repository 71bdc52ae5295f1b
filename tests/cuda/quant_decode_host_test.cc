// The device decoding of the GGUF block formats (kernels/cuda/quant_decode.cuh), run on the host:
// every 8-element chunk of random rows, found as the kernels find it (block c / chunks-per-block,
// chunk c % chunks-per-block), must equal cpu::DequantizeRow's elements bit for bit, for Q4_0,
// Q8_0, Q4_K, Q5_K and Q6_K, on quantized rows and on raw random bytes (every quant, 6-bit
// scale/min and Q6_K scale pattern). This is the part of the quantized-weight kernels that can be
// checked without a GPU: the bit placement. What only a GPU can check (the kernels' indexing,
// reductions, launches) is in quant_gemv_test.cc.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/quant_types.h"
#include "kernels/cuda/quant_decode.cuh"

namespace heavykv {
namespace {

using cpu::QuantType;
using cuda::QuantBlockTraits;
using cuda::QuantBlockType;

// Random rows: quantized from uniform values, or raw bytes with finite fp16 scales.
std::vector<uint8_t> Blocks(QuantType t, int64_t n, int64_t k, uint32_t seed, bool raw) {
  const int64_t row_bytes = cpu::QuantRowBytes(t, k);
  std::vector<uint8_t> bytes(n * row_bytes);
  std::mt19937 rng(seed);
  if (!raw) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> w(k);
    for (int64_t r = 0; r < n; ++r) {
      for (float& x : w) x = u(rng);
      cpu::QuantizeRow(t, w.data(), bytes.data() + r * row_bytes, k);
    }
    return bytes;
  }
  for (uint8_t& b : bytes) b = uint8_t(rng());
  std::uniform_real_distribution<float> scale(0.001f, 0.02f);
  const int64_t block = cpu::QuantBlockBytes(t);
  std::vector<int> fields = {0};
  if (t == QuantType::kQ4_K || t == QuantType::kQ5_K) fields = {0, 2};
  if (t == QuantType::kQ6_K) fields = {208};
  for (int64_t off = 0; off < int64_t(bytes.size()); off += block) {
    for (int f : fields) {
      const uint16_t h = cpu::FloatToFp16(scale(rng));
      std::memcpy(bytes.data() + off + f, &h, 2);
    }
  }
  return bytes;
}

template <QuantBlockType T>
void CheckFormat() {
  const QuantType t = static_cast<QuantType>(T);
  constexpr int kChunks = QuantBlockTraits<T>::kElems / 8;
  constexpr int kBytes = QuantBlockTraits<T>::kBytes;
  const int64_t n = 5, k = 768;
  for (bool raw : {false, true}) {
    SCOPED_TRACE(absl::StrCat(cpu::QuantTypeName(t), raw ? " raw bytes" : " quantized"));
    const std::vector<uint8_t> bytes = Blocks(t, n, k, 17, raw);
    const int64_t row_bytes = cpu::QuantRowBytes(t, k);
    std::vector<float> want(k);
    int mismatches = 0;
    for (int64_t r = 0; r < n; ++r) {
      const uint8_t* row = bytes.data() + r * row_bytes;
      cpu::DequantizeRow(t, row, want.data(), k);
      for (int64_t c = 0; c < k / 8; ++c) {
        float v[8];
        cuda::DecodeChunk<T>(row + (c / kChunks) * kBytes, int(c % kChunks), v);
        for (int i = 0; i < 8; ++i) {
          if (std::memcmp(&v[i], &want[c * 8 + i], sizeof(float)) != 0 && ++mismatches <= 5) {
            ADD_FAILURE() << "row " << r << " element " << c * 8 + i << ": decoded " << v[i]
                          << ", reference " << want[c * 8 + i];
          }
        }
      }
    }
    EXPECT_EQ(mismatches, 0);
  }
}

TEST(QuantDecodeHostTest, Q4_0ChunksEqualTheReference) { CheckFormat<QuantBlockType::kQ4_0>(); }
TEST(QuantDecodeHostTest, Q8_0ChunksEqualTheReference) { CheckFormat<QuantBlockType::kQ8_0>(); }
TEST(QuantDecodeHostTest, Q4_KChunksEqualTheReference) { CheckFormat<QuantBlockType::kQ4_K>(); }
TEST(QuantDecodeHostTest, Q5_KChunksEqualTheReference) { CheckFormat<QuantBlockType::kQ5_K>(); }
TEST(QuantDecodeHostTest, Q6_KChunksEqualTheReference) { CheckFormat<QuantBlockType::kQ6_K>(); }

TEST(QuantDecodeHostTest, BlockGeometryIsTheCpus) {
  for (QuantType t :
       {QuantType::kQ4_0, QuantType::kQ8_0, QuantType::kQ4_K, QuantType::kQ5_K, QuantType::kQ6_K}) {
    const auto b = static_cast<QuantBlockType>(t);
    EXPECT_EQ(cuda::QuantBlockElemsOf(b), cpu::QuantBlockElems(t)) << cpu::QuantTypeName(t);
    EXPECT_EQ(cuda::QuantBlockBytesOf(b), cpu::QuantBlockBytes(t)) << cpu::QuantTypeName(t);
  }
  EXPECT_EQ(cuda::QuantBlockElemsOf(static_cast<QuantBlockType>(QuantType::kQ5_0)), 0);
}

}  // namespace
}  // namespace heavykv
