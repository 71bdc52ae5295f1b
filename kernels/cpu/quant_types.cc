#include "kernels/cpu/quant_types.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "kernels/bf16.h"
#include "kernels/cpu/quant_kquants.h"

namespace heavykv::cpu {
namespace {

using internal::NearestInt;

inline uint16_t Load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, sizeof(v)); }

// Q8_0: d = max|x| / 127, q = round(x / d) (halves away from zero, as roundf).
void QuantizeQ8_0(const float* x, uint8_t* dst, int64_t k) {
  for (int64_t b = 0; b < k / 32; ++b, x += 32, dst += 34) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    Store16(dst, FloatToFp16(d));
    for (int j = 0; j < 32; ++j) dst[2 + j] = uint8_t(int8_t(std::roundf(x[j] * id)));
  }
}

void DequantizeQ8_0(const uint8_t* src, float* y, int64_t k) {
  for (int64_t b = 0; b < k / 32; ++b, src += 34, y += 32) {
    const float d = Fp16ToFloat(Load16(src));
    for (int j = 0; j < 32; ++j) y[j] = float(int8_t(src[2 + j])) * d;
  }
}

// The signed value of largest magnitude (the first one on ties), which Q4_0 and Q5_0 map to the
// most negative level so that the full range of levels is used.
float SignedAbsMax(const float* x) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

// Q4_0: d = max / -8, q = min(15, trunc(x / d + 8.5)).
void QuantizeQ4_0(const float* x, uint8_t* dst, int64_t k) {
  for (int64_t b = 0; b < k / 32; ++b, x += 32, dst += 18) {
    const float d = SignedAbsMax(x) / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    Store16(dst, FloatToFp16(d));
    for (int j = 0; j < 16; ++j) {
      const uint8_t q0 = std::min<uint8_t>(15, uint8_t(int8_t(x[j] * id + 8.5f)));
      const uint8_t q1 = std::min<uint8_t>(15, uint8_t(int8_t(x[16 + j] * id + 8.5f)));
      dst[2 + j] = uint8_t(q0 | (q1 << 4));
    }
  }
}

void DequantizeQ4_0(const uint8_t* src, float* y, int64_t k) {
  for (int64_t b = 0; b < k / 32; ++b, src += 18, y += 32) {
    const float d = Fp16ToFloat(Load16(src));
    for (int j = 0; j < 16; ++j) {
      y[j] = float((src[2 + j] & 0xF) - 8) * d;
      y[16 + j] = float((src[2 + j] >> 4) - 8) * d;
    }
  }
}

// Q5_0: d = max / -16, q = min(31, trunc(x / d + 16.5)); low nibbles as Q4_0, 5th bits in qh.
void QuantizeQ5_0(const float* x, uint8_t* dst, int64_t k) {
  for (int64_t b = 0; b < k / 32; ++b, x += 32, dst += 22) {
    const float d = SignedAbsMax(x) / -16;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    Store16(dst, FloatToFp16(d));
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      const uint8_t q0 = std::min<uint8_t>(31, uint8_t(int8_t(x[j] * id + 16.5f)));
      const uint8_t q1 = std::min<uint8_t>(31, uint8_t(int8_t(x[16 + j] * id + 16.5f)));
      dst[6 + j] = uint8_t((q0 & 0xF) | ((q1 & 0xF) << 4));
      qh |= uint32_t(q0 >> 4) << j;
      qh |= uint32_t(q1 >> 4) << (j + 16);
    }
    std::memcpy(dst + 2, &qh, sizeof(qh));
  }
}

void DequantizeQ5_0(const uint8_t* src, float* y, int64_t k) {
  for (int64_t b = 0; b < k / 32; ++b, src += 22, y += 32) {
    const float d = Fp16ToFloat(Load16(src));
    uint32_t qh;
    std::memcpy(&qh, src + 2, sizeof(qh));
    for (int j = 0; j < 16; ++j) {
      const int q0 = (src[6 + j] & 0xF) | int(((qh >> j) & 1) << 4);
      const int q1 = (src[6 + j] >> 4) | int(((qh >> (j + 16)) & 1) << 4);
      y[j] = float(q0 - 16) * d;
      y[16 + j] = float(q1 - 16) * d;
    }
  }
}

void CheckRow(QuantType type, int64_t k) {
  if (k < 0 || k % QuantBlockElems(type) != 0) {
    std::fprintf(stderr, "heavykv: a %s row of %lld elements is not whole blocks of %lld\n",
                 QuantTypeName(type), static_cast<long long>(k),
                 static_cast<long long>(QuantBlockElems(type)));
    std::abort();
  }
}

}  // namespace

absl::StatusOr<QuantType> QuantTypeFromGgmlId(uint32_t id) {
  for (QuantType type : kAllQuantTypes) {
    if (static_cast<uint32_t>(type) == id) return type;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "ggml tensor type ", id,
      " has no CPU kernel (supported: f32, f16, bf16, q8_0, q4_0, q5_0, q4_K, q5_K, q6_K)"));
}

void DequantizeRow(QuantType type, const void* src, float* dst, int64_t k) {
  CheckRow(type, k);
  const auto* s = static_cast<const uint8_t*>(src);
  switch (type) {
    case QuantType::kF32:
      std::memcpy(dst, s, k * sizeof(float));
      break;
    case QuantType::kF16:
      for (int64_t i = 0; i < k; ++i) dst[i] = Fp16ToFloat(Load16(s + 2 * i));
      break;
    case QuantType::kBF16:
      for (int64_t i = 0; i < k; ++i) dst[i] = Bf16ToFloat(Load16(s + 2 * i));
      break;
    case QuantType::kQ8_0:
      DequantizeQ8_0(s, dst, k);
      break;
    case QuantType::kQ4_0:
      DequantizeQ4_0(s, dst, k);
      break;
    case QuantType::kQ5_0:
      DequantizeQ5_0(s, dst, k);
      break;
    case QuantType::kQ4_K:
      internal::DequantizeQ4K(s, dst, k);
      break;
    case QuantType::kQ5_K:
      internal::DequantizeQ5K(s, dst, k);
      break;
    case QuantType::kQ6_K:
      internal::DequantizeQ6K(s, dst, k);
      break;
    default:
      std::abort();  // not one of kAllQuantTypes: the caller validated the type
  }
}

void QuantizeRow(QuantType type, const float* src, void* dst, int64_t k) {
  CheckRow(type, k);
  auto* d = static_cast<uint8_t*>(dst);
  switch (type) {
    case QuantType::kF32:
      std::memcpy(d, src, k * sizeof(float));
      break;
    case QuantType::kF16:
      for (int64_t i = 0; i < k; ++i) Store16(d + 2 * i, FloatToFp16(src[i]));
      break;
    case QuantType::kBF16:
      for (int64_t i = 0; i < k; ++i) Store16(d + 2 * i, FloatToBf16(src[i]));
      break;
    case QuantType::kQ8_0:
      QuantizeQ8_0(src, d, k);
      break;
    case QuantType::kQ4_0:
      QuantizeQ4_0(src, d, k);
      break;
    case QuantType::kQ5_0:
      QuantizeQ5_0(src, d, k);
      break;
    case QuantType::kQ4_K:
      internal::QuantizeQ4K(src, d, k);
      break;
    case QuantType::kQ5_K:
      internal::QuantizeQ5K(src, d, k);
      break;
    case QuantType::kQ6_K:
      internal::QuantizeQ6K(src, d, k);
      break;
    default:
      std::abort();  // not one of kAllQuantTypes: the caller validated the type
  }
}

}  // namespace heavykv::cpu
