// 16-bit floats. bf16 <-> fp32 for the K/V cache (--kv-dtype bf16) and packed weights
// (--weight-dtype bf16): a bf16 is the upper 16 bits of an fp32 (same exponent range, 8 significant
// bits), as in vLLM, llama.cpp and the CUDA backend. IEEE fp16 <-> fp32 for GGUF F16 tensors and
// block scales, and the int4 K/V scales (kernels/kv_quant.h).
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

// IEEE fp16 <-> fp32, rounded to nearest even; subnormals, infinities and NaN preserved.
inline float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else {
    // Zero or subnormal: mant * 2^-24, exact in fp32.
    float f = float(mant) * 5.9604644775390625e-8f;
    std::memcpy(&bits, &f, sizeof(bits));
    bits |= sign;
  }
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

inline uint16_t FloatToFp16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return uint16_t(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));  // NaN
  if (abs >= 0x477FF000u) return uint16_t(sign | 0x7C00u);  // rounds past 65504: infinity
  if (abs < 0x38800000u) {
    // Below 2^-14: a subnormal (or zero). Adding 0.5 aligns the mantissa's unit to 2^-24 and the
    // fp32 addition rounds to nearest even there.
    float a;
    std::memcpy(&a, &abs, sizeof(a));
    a += 0.5f;
    uint32_t r;
    std::memcpy(&r, &a, sizeof(r));
    return uint16_t(sign | (r - 0x3F000000u));
  }
  // Normal: rebias the exponent and round the 13 dropped bits to nearest even.
  const uint32_t rounded = abs + 0xFFFu + ((abs >> 13) & 1u);
  return uint16_t(sign | ((rounded - 0x38000000u) >> 13));
}

}  // namespace heavykv
