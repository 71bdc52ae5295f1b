// Internal to quant_types.cc: the K-quant formats (super-blocks of 256 elements), quantizers and
// portable dequantizers. Callers use QuantizeRow / DequantizeRow (quant_types.h).
#pragma once

#include <cstdint>
#include <cstring>

namespace heavykv::cpu::internal {

inline constexpr int kQk = 256;  // elements per K-quant super-block

// Round to nearest, ties to even, as llama.cpp's nearest_int does (adding 1.5 * 2^23 leaves the
// integer in the low mantissa bits); |f| must be below 2^22.
inline int NearestInt(float f) {
  const float v = f + 12582912.0f;
  int32_t i;
  std::memcpy(&i, &v, sizeof(i));
  return (i & 0x007FFFFF) - 0x00400000;
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block's 12 scale bytes:
// sub-blocks 0-3 in the low 6 bits of bytes j (scale) and j + 4 (min); sub-blocks 4-7 keep their
// low 4 bits in byte j + 4 (scale low nibble, min high nibble) and their top 2 bits in the top
// bits of bytes j - 4 (scale) and j (min).
inline void KScaleMin(const uint8_t* s, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = s[j] & 63;
    *min = s[j + 4] & 63;
  } else {
    *scale = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void QuantizeQ4K(const float* x, uint8_t* dst, int64_t k);
void QuantizeQ5K(const float* x, uint8_t* dst, int64_t k);
void QuantizeQ6K(const float* x, uint8_t* dst, int64_t k);
void DequantizeQ4K(const uint8_t* src, float* y, int64_t k);
void DequantizeQ5K(const uint8_t* src, float* y, int64_t k);
void DequantizeQ6K(const uint8_t* src, float* y, int64_t k);

}  // namespace heavykv::cpu::internal
