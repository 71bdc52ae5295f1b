// bf16 <-> fp32 for the K/V cache (--kv-dtype bf16) and packed weights (--weight-dtype bf16):
// a bf16 is the upper 16 bits of an fp32 (same exponent range, 8 significant bits), as in vLLM,
// llama.cpp and the CUDA backend.
#pragma once

#include <cstdint>
#include <cstring>

namespace heavykv {

// fp32 -> bf16, rounded to nearest even (NaN stays NaN).
inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float Bf16ToFloat(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace heavykv
