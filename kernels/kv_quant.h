// Quantized K/V rows (--kv-dtype int8 | int4): the formats, and the quantize / dequantize of one
// row of one kv head. docs/ARCHITECTURE.md "The KV pool" says why these formats.
//
//   int8: head_dim signed bytes q and one scale byte e (e8m0, as the OCP microscaling formats):
//         x ~ q * 2^(e - 127), e the smallest in [1, 254] with max|x| / 2^(e - 127) <= 127.
//   int4: groups of g = Int4Group(head_dim) elements (32, or head_dim when it is not a multiple of
//         32; head_dim even). Group k: g / 2 data bytes at data + k * g / 2, byte j holding element
//         j in its low nibble and element j + g / 2 in its high one, each as q + 8 in [0, 15]; an
//         fp16 scale d at scale + 2 * k, d = m / -t with m the element of largest magnitude and t
//         in [6, 10] by halves, the one with the least squared error (ggml's Q4_0 takes t = 8):
//         x ~ (nibble - 8) * d.
// Row data and scales live apart (the page keeps its rows aligned; memory/kv_cache.h places
// them), so a row is (data, scale) pointers. The cache stores H x rather than x where head_dim
// is a power of two (KvRotates, HadamardRotate; PagedKvHead applies it): these functions code
// whatever row they are given.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "kernels/bf16.h"

namespace heavykv {

enum class KvQuant : uint8_t { kNone, kInt8, kInt4 };

// "int8", "int4" ("none" for kNone): the names users write (--kv-dtype, kv_dtype, demote=).
inline const char* KvQuantName(KvQuant q) {
  return q == KvQuant::kInt8 ? "int8" : q == KvQuant::kInt4 ? "int4" : "none";
}
// The format named "int8" or "int4" into *q; false for any other text.
inline bool ParseKvQuant(std::string_view text, KvQuant* q) {
  if (text != "int8" && text != "int4") return false;
  *q = text == "int8" ? KvQuant::kInt8 : KvQuant::kInt4;
  return true;
}

// Elements per int4 scale group.
inline int32_t Int4Group(int32_t head_dim) { return head_dim % 32 == 0 ? 32 : head_dim; }
// Whether rows of head_dim elements can take the format: at most 1024 (the rotation's buffer),
// and even for int4.
inline bool KvQuantTakes(KvQuant q, int32_t head_dim) {
  return head_dim > 0 && head_dim <= 1024 && (q != KvQuant::kInt4 || head_dim % 2 == 0);
}
// Bytes of one row's data and of its scales.
inline int32_t KvQuantDataBytes(KvQuant q, int32_t head_dim) {
  return q == KvQuant::kInt4 ? head_dim / 2 : head_dim;
}
inline int32_t KvQuantScaleBytes(KvQuant q, int32_t head_dim) {
  return q == KvQuant::kInt4 ? 2 * (head_dim / Int4Group(head_dim)) : 1;
}

// 2^(e - 127) for an e8m0 byte in [1, 254], as an fp32 built in its exponent bits.
inline float E8m0ToFloat(uint8_t e) {
  const uint32_t bits = uint32_t(e) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Quantizes x[head_dim] into one row: data (KvQuantDataBytes) and scale (KvQuantScaleBytes).
inline void QuantizeKvRow(KvQuant q, const float* x, int32_t head_dim, uint8_t* data,
                          uint8_t* scale) {
  if (q == KvQuant::kInt8) {
    float amax = 0.0f;
    for (int32_t d = 0; d < head_dim; ++d) amax = std::max(amax, std::fabs(x[d]));
    // The smallest k with amax <= 127 * 2^k: frexp's exponent, then one step either way for the
    // rounding of amax / 127.
    int k = -126;
    if (amax > 0.0f && std::isfinite(amax)) {
      std::frexp(amax / 127.0f, &k);
      while (k > -126 && amax <= 127.0f * std::ldexp(1.0f, k - 1)) --k;
      while (amax > 127.0f * std::ldexp(1.0f, k)) ++k;
      k = std::clamp(k, -126, 127);
    }
    *scale = static_cast<uint8_t>(k + 127);
    const float inv = std::ldexp(1.0f, -k);
    for (int32_t d = 0; d < head_dim; ++d) {
      // fmin/fmax, not clamp: a NaN (a broken activation) becomes a bound, never an undefined
      // float-to-int conversion.
      const float v = std::fmax(-127.0f, std::fmin(127.0f, std::nearbyint(x[d] * inv)));
      data[d] = static_cast<uint8_t>(static_cast<int8_t>(v));
    }
    return;
  }
  const int32_t g = Int4Group(head_dim), half = g / 2;
  for (int32_t k = 0; k < head_dim / g; ++k) {
    const float* xg = x + k * g;
    float m = 0.0f;
    for (int32_t j = 0; j < g; ++j) {
      if (std::fabs(xg[j]) > std::fabs(m)) m = xg[j];
    }
    // The scale with the least squared error among m / -t, t in [6, 10] by halves (m / -8 maps m
    // to -8 exactly, as Q4_0; a smaller step rounds the rest finer at the price of clipping), each
    // taken after its rounding to fp16, as it is read back.
    float d = 0.0f, best = INFINITY;
    for (float t = 6.0f; t <= 10.0f; t += 0.5f) {
      const float cand = Fp16ToFloat(FloatToFp16(m / -t));
      if (cand == 0.0f || !std::isfinite(cand)) continue;
      const float ic = 1.0f / cand;
      float err = 0.0f;
      for (int32_t j = 0; j < g; ++j) {
        const float q = std::fmax(-8.0f, std::fmin(7.0f, std::nearbyint(xg[j] * ic)));
        err += (q * cand - xg[j]) * (q * cand - xg[j]);
      }
      if (err < best) {
        best = err;
        d = cand;
      }
    }
    const uint16_t h = FloatToFp16(d);
    std::memcpy(scale + 2 * k, &h, sizeof(h));
    const float inv = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t* out = data + k * half;
    for (int32_t j = 0; j < half; ++j) {
      const auto nib = [&](float v) {
        const float q = std::nearbyint(v * inv) + 8.0f;
        return static_cast<uint8_t>(std::fmax(0.0f, std::fmin(15.0f, q)));
      };
      out[j] = static_cast<uint8_t>(nib(xg[j]) | (nib(xg[j + half]) << 4));
    }
  }
}

// Element d of a row, as fp32.
inline float DequantKvElem(KvQuant q, const uint8_t* data, const uint8_t* scale,
                           int32_t head_dim, int32_t d) {
  if (q == KvQuant::kInt8) return float(static_cast<int8_t>(data[d])) * E8m0ToFloat(*scale);
  const int32_t g = Int4Group(head_dim), half = g / 2, k = d / g, j = d % g;
  uint16_t h;
  std::memcpy(&h, scale + 2 * k, sizeof(h));
  const uint8_t byte = data[k * half + (j % half)];
  const int32_t nib = j < half ? (byte & 0x0F) : (byte >> 4);
  return float(nib - 8) * Fp16ToFloat(h);
}

// Whether rows of head_dim elements are stored rotated (a power of two: the Walsh-Hadamard
// transform below; docs/ARCHITECTURE.md "The KV pool" says why).
inline bool KvRotates(KvQuant q, int32_t head_dim) {
  return q != KvQuant::kNone && head_dim >= 2 && (head_dim & (head_dim - 1)) == 0;
}

// x = H x for the orthonormal Walsh-Hadamard matrix H of order n (a power of two): H = H^T =
// H^-1, so rotating twice gives x back (to float rounding) and dot products are kept,
// (H q) . (H k) = q . k. n log2 n additions and n multiplications.
inline void HadamardRotate(float* x, int32_t n) {
  for (int32_t h = 1; h < n; h *= 2) {
    for (int32_t i = 0; i < n; i += 2 * h) {
      for (int32_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  const float norm = 1.0f / std::sqrt(static_cast<float>(n));
  for (int32_t i = 0; i < n; ++i) x[i] *= norm;
}

// out[head_dim] = the row's values.
inline void DequantizeKvRow(KvQuant q, const uint8_t* data, const uint8_t* scale,
                            int32_t head_dim, float* out) {
  if (q == KvQuant::kInt8) {
    const float s = E8m0ToFloat(*scale);
    for (int32_t d = 0; d < head_dim; ++d) out[d] = float(static_cast<int8_t>(data[d])) * s;
    return;
  }
  const int32_t g = Int4Group(head_dim), half = g / 2;
  for (int32_t k = 0; k < head_dim / g; ++k) {
    uint16_t h;
    std::memcpy(&h, scale + 2 * k, sizeof(h));
    const float s = Fp16ToFloat(h);
    const uint8_t* in = data + k * half;
    for (int32_t j = 0; j < half; ++j) {
      out[k * g + j] = float((in[j] & 0x0F) - 8) * s;
      out[k * g + j + half] = float((in[j] >> 4) - 8) * s;
    }
  }
}

}  // namespace heavykv
