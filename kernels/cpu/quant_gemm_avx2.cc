// The AVX2 pieces of MatmulQuant (quant_gemm.h): a dequantizer per QuantType that turns 8 levels
// at a time into fp32 (widen the bytes, place the high bits, scale), a dot product of one
// dequantized row with up to 4 activation rows at a time, and the 8x8 transpose that writes
// dequantized rows into a panel's columns. All compiled for AVX2 + FMA + F16C (every AVX2 CPU,
// Haswell and Zen onwards, has F16C) and run only where IsaSupported(kAvx2).
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu/packed_matrix.h"
#include "kernels/cpu/quant_gemm_paths.h"
#include "kernels/cpu/quant_kquants.h"

#define HEAVYKV_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace heavykv::cpu::internal {
namespace {

HEAVYKV_AVX2 inline float HalfAt(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return _cvtsh_ss(h);
}

// 8 bytes at p as eight int32 lanes (unsigned / signed).
HEAVYKV_AVX2 inline __m256i U8x8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
HEAVYKV_AVX2 inline __m256i I8x8(const uint8_t* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
// Lane i: 16 if bit `bit0 + i` of `bits` is set, else 0 (i < 8).
HEAVYKV_AVX2 inline __m256i Bit4From(uint32_t bits, int bit0) {
  const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i b = _mm256_and_si256(_mm256_set1_epi32(int((bits >> bit0) & 0xFF)), lane_bit);
  return _mm256_and_si256(_mm256_cmpeq_epi32(b, lane_bit), _mm256_set1_epi32(16));
}
HEAVYKV_AVX2 inline void Store(float* y, __m256i q, __m256 d) {
  _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
}

HEAVYKV_AVX2 void Q8_0(const uint8_t* src, float* y, int64_t k) {
  for (int64_t b = 0; b < k / 32; ++b, src += 34, y += 32) {
    const __m256 d = _mm256_set1_ps(HalfAt(src));
    for (int j = 0; j < 32; j += 8) Store(y + j, I8x8(src + 2 + j), d);
  }
}

HEAVYKV_AVX2 void Q4_0(const uint8_t* src, float* y, int64_t k) {
  const __m256i eight = _mm256_set1_epi32(8), low = _mm256_set1_epi32(0xF);
  for (int64_t b = 0; b < k / 32; ++b, src += 18, y += 32) {
    const __m256 d = _mm256_set1_ps(HalfAt(src));
    for (int j = 0; j < 16; j += 8) {
      const __m256i q = U8x8(src + 2 + j);
      Store(y + j, _mm256_sub_epi32(_mm256_and_si256(q, low), eight), d);
      Store(y + 16 + j, _mm256_sub_epi32(_mm256_srli_epi32(q, 4), eight), d);
    }
  }
}

HEAVYKV_AVX2 void Q5_0(const uint8_t* src, float* y, int64_t k) {
  const __m256i sixteen = _mm256_set1_epi32(16), low = _mm256_set1_epi32(0xF);
  for (int64_t b = 0; b < k / 32; ++b, src += 22, y += 32) {
    const __m256 d = _mm256_set1_ps(HalfAt(src));
    uint32_t qh;
    std::memcpy(&qh, src + 2, sizeof(qh));
    for (int j = 0; j < 16; j += 8) {
      const __m256i q = U8x8(src + 6 + j);
      const __m256i q0 = _mm256_or_si256(_mm256_and_si256(q, low), Bit4From(qh, j));
      const __m256i q1 = _mm256_or_si256(_mm256_srli_epi32(q, 4), Bit4From(qh, 16 + j));
      Store(y + j, _mm256_sub_epi32(q0, sixteen), d);
      Store(y + 16 + j, _mm256_sub_epi32(q1, sixteen), d);
    }
  }
}

// Q4_K and Q5_K: x = d * sc * q - dmin * m per sub-block of 32; Q5_K adds bit 4 from qh.
template <bool kFiveBits>
HEAVYKV_AVX2 void QK45(const uint8_t* src, float* y, int64_t k) {
  constexpr int64_t kBytes = kFiveBits ? 176 : 144;
  const __m256i low = _mm256_set1_epi32(0xF), sixteen = _mm256_set1_epi32(16);
  for (int64_t b = 0; b < k / kQk; ++b, src += kBytes) {
    const float d = HalfAt(src), dmin = HalfAt(src + 2);
    const uint8_t* qh = src + 16;
    const uint8_t* q = src + (kFiveBits ? 48 : 16);
    for (int j = 0; j < 8; j += 2, q += 32, y += 64) {
      int sc0, m0, sc1, m1;
      KScaleMin(src + 4, j, &sc0, &m0);
      KScaleMin(src + 4, j + 1, &sc1, &m1);
      const __m256 d0 = _mm256_set1_ps(d * sc0), mm0 = _mm256_set1_ps(dmin * m0);
      const __m256 d1 = _mm256_set1_ps(d * sc1), mm1 = _mm256_set1_ps(dmin * m1);
      for (int l = 0; l < 32; l += 8) {
        const __m256i v = U8x8(q + l);
        __m256i lo = _mm256_and_si256(v, low), hi = _mm256_srli_epi32(v, 4);
        if constexpr (kFiveBits) {
          const __m256i h = U8x8(qh + l);
          const __m256i b0 = _mm256_set1_epi32(1 << j), b1 = _mm256_set1_epi32(2 << j);
          lo = _mm256_or_si256(
              lo, _mm256_and_si256(_mm256_cmpeq_epi32(_mm256_and_si256(h, b0), b0), sixteen));
          hi = _mm256_or_si256(
              hi, _mm256_and_si256(_mm256_cmpeq_epi32(_mm256_and_si256(h, b1), b1), sixteen));
        }
        _mm256_storeu_ps(y + l, _mm256_sub_ps(_mm256_mul_ps(d0, _mm256_cvtepi32_ps(lo)), mm0));
        _mm256_storeu_ps(y + 32 + l, _mm256_sub_ps(_mm256_mul_ps(d1, _mm256_cvtepi32_ps(hi)), mm1));
      }
    }
  }
}

// Bits 4-5 of a Q6_K level: bits shift, shift + 1 of its qh byte (one per lane).
HEAVYKV_AVX2 inline __m256i TopBits(__m256i h, int shift, __m256i three) {
  return _mm256_slli_epi32(_mm256_and_si256(_mm256_srl_epi32(h, _mm_cvtsi32_si128(shift)), three),
                           4);
}

HEAVYKV_AVX2 void Q6_K(const uint8_t* src, float* y, int64_t k) {
  const __m256i low = _mm256_set1_epi32(0xF), three = _mm256_set1_epi32(3);
  const __m256i bias = _mm256_set1_epi32(32);
  for (int64_t b = 0; b < k / kQk; ++b, src += 210) {
    const float d = HalfAt(src + 208);
    const uint8_t* ql = src;
    const uint8_t* qh = src + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(src + 192);
    for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, y += 128) {
      for (int l = 0; l < 32; l += 8) {
        const int s = l / 16;
        const __m256i a = U8x8(ql + l), c = U8x8(ql + 32 + l), h = U8x8(qh + l);
        const __m256i q1 = _mm256_or_si256(_mm256_and_si256(a, low), TopBits(h, 0, three));
        const __m256i q2 = _mm256_or_si256(_mm256_and_si256(c, low), TopBits(h, 2, three));
        const __m256i q3 = _mm256_or_si256(_mm256_srli_epi32(a, 4), TopBits(h, 4, three));
        const __m256i q4 = _mm256_or_si256(_mm256_srli_epi32(c, 4), TopBits(h, 6, three));
        Store(y + l, _mm256_sub_epi32(q1, bias), _mm256_set1_ps(d * sc[s]));
        Store(y + 32 + l, _mm256_sub_epi32(q2, bias), _mm256_set1_ps(d * sc[s + 2]));
        Store(y + 64 + l, _mm256_sub_epi32(q3, bias), _mm256_set1_ps(d * sc[s + 4]));
        Store(y + 96 + l, _mm256_sub_epi32(q4, bias), _mm256_set1_ps(d * sc[s + 6]));
      }
    }
  }
}

HEAVYKV_AVX2 void F16(const uint8_t* src, float* y, int64_t k) {
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    _mm256_storeu_ps(
        y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i))));
  }
  for (; i < k; ++i) y[i] = HalfAt(src + 2 * i);
}

HEAVYKV_AVX2 void Bf16(const uint8_t* src, float* y, int64_t k) {
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    const __m256i h =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i)));
    _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
  }
  for (; i < k; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, sizeof(h));
    const uint32_t u = uint32_t(h) << 16;
    std::memcpy(y + i, &u, sizeof(u));
  }
}

HEAVYKV_AVX2 inline float HorizontalSum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// out[R] = x[R][k] . w[k], two vectors of inputs per step (2R independent accumulators).
template <int R>
HEAVYKV_AVX2 void DotN(const float* x, int64_t k, const float* w, float* out) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  int64_t kk = 0;
  for (; kk + 16 <= k; kk += 16) {
    const __m256 w0 = _mm256_loadu_ps(w + kk), w1 = _mm256_loadu_ps(w + kk + 8);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      acc[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * k + kk), w0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * k + kk + 8), w1, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float s = HorizontalSum(_mm256_add_ps(acc[r][0], acc[r][1]));
    for (int64_t t = kk; t < k; ++t) s += x[r * k + t] * w[t];
    out[r] = s;
  }
}

}  // namespace

void DequantizeRowAvx2(QuantType type, const uint8_t* src, float* out, int64_t k) {
  switch (type) {
    case QuantType::kF32:
      std::memcpy(out, src, k * sizeof(float));
      break;
    case QuantType::kF16:
      F16(src, out, k);
      break;
    case QuantType::kBF16:
      Bf16(src, out, k);
      break;
    case QuantType::kQ8_0:
      Q8_0(src, out, k);
      break;
    case QuantType::kQ4_0:
      Q4_0(src, out, k);
      break;
    case QuantType::kQ5_0:
      Q5_0(src, out, k);
      break;
    case QuantType::kQ4_K:
      QK45<false>(src, out, k);
      break;
    case QuantType::kQ5_K:
      QK45<true>(src, out, k);
      break;
    case QuantType::kQ6_K:
      Q6_K(src, out, k);
      break;
    default:
      std::abort();  // not one of kAllQuantTypes: the caller validated the type
  }
}

void DotRowsAvx2(const float* x, int64_t m, int64_t k, const float* w, float* out) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) DotN<4>(x + i * k, k, w, out + i);
  switch (m - i) {
    case 3:
      DotN<3>(x + i * k, k, w, out + i);
      break;
    case 2:
      DotN<2>(x + i * k, k, w, out + i);
      break;
    case 1:
      DotN<1>(x + i * k, k, w, out + i);
      break;
    default:
      break;
  }
}

HEAVYKV_AVX2 void TransposeRows8Avx2(const float* rows, int64_t k, float* panel) {
  int64_t kk = 0;
  for (; kk + 8 <= k; kk += 8) {
    __m256 r[8], t[8], s[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(rows + i * k + kk);
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);      // rows i, i+1: columns 0, 1 | 4, 5
      t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);  // columns 2, 3 | 6, 7
    }
    for (int i = 0; i < 8; i += 4) {
      s[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);          // column 0 | 4 of 4 rows
      s[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);      // column 1 | 5
      s[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);  // column 2 | 6
      s[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);  // column 3 | 7
    }
    for (int c = 0; c < 4; ++c) {
      _mm256_storeu_ps(panel + (kk + c) * kPanelRows, _mm256_permute2f128_ps(s[c], s[c + 4], 0x20));
      _mm256_storeu_ps(panel + (kk + c + 4) * kPanelRows,
                       _mm256_permute2f128_ps(s[c], s[c + 4], 0x31));
    }
  }
  for (; kk < k; ++kk) {
    for (int j = 0; j < 8; ++j) panel[kk * kPanelRows + j] = rows[j * k + kk];
  }
}

}  // namespace heavykv::cpu::internal
