// DotTileAvx2 (quant_dot_kernel.h): the int8 dot kernel of quant_dot_simd.h for AVX2 (256-bit
// maddubs + madd), and UnpackSliceAvx2: quant_dot.h's weight unpackers in AVX2 (a block's levels at
// 32 bytes a time: nibbles split with a mask and a shift, high bits spread with shifts or a byte
// shuffle and a compare), which the AVX-512 paths use too: their cost is the row's bytes once, next
// to a dot kernel that is already wider. This file is compiled with -mavx2 -mfma -mf16c
// (kernels/cpu/CMakeLists.txt) and must only be called where the CPU has them (quant_gemm.cc
// checks); it includes nothing with external linkage that another file could share.
#include "kernels/cpu/quant_dot_simd.h"

namespace heavykv::cpu::internal {
namespace {

inline float Half(const uint8_t* p) {
  uint16_t h;
  __builtin_memcpy(&h, p, sizeof(h));
  return _cvtsh_ss(h);
}
inline __m256i Load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
inline void Store32(uint8_t* p, __m256i v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
}
// quant_kquants.h's KScaleMin, here with internal linkage (see the file comment).
inline void KScaleMinSimd(const uint8_t* s, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = s[j] & 63;
    *min = s[j + 4] & 63;
  } else {
    *scale = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}
// Lanes [g, g + 8) of wsc and their two offsets in wmn.
inline void Fill8(const UnpackedSlice& o, int64_t g, float sc, float mn) {
  _mm256_storeu_ps(o.wsc + g, _mm256_set1_ps(sc));
  o.wmn[g / 4] = o.wmn[g / 4 + 1] = mn;
}
// The 32 low nibbles of q[0..15] then the 16 high ones.
inline __m256i Nibbles16(const uint8_t* q) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  const __m128i low = _mm_set1_epi8(0xF);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), low), _mm_and_si128(b, low));
}
// Byte j: 16 if bit j of `bits` is set, else 0.
inline __m256i Bits32(uint32_t bits) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(int(bits)),
      _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                          _mm256_set1_epi8(16));
}

void Q8_0(const uint8_t* src, int64_t nb, const UnpackedSlice& o) {
  const __m256i flip = _mm256_set1_epi8(char(0x80));
  for (int64_t b = 0; b < nb; ++b, src += 34) {
    const float d = Half(src);
    Store32(o.lv + 32 * b, _mm256_xor_si256(Load32(src + 2), flip));
    Fill8(o, 8 * b, d, 128.0f * d);
  }
}

void Q4_0(const uint8_t* src, int64_t nb, const UnpackedSlice& o) {
  for (int64_t b = 0; b < nb; ++b, src += 18) {
    const float d = Half(src);
    Store32(o.lv + 32 * b, Nibbles16(src + 2));
    Fill8(o, 8 * b, d, 8.0f * d);
  }
}

void Q5_0(const uint8_t* src, int64_t nb, const UnpackedSlice& o) {
  for (int64_t b = 0; b < nb; ++b, src += 22) {
    const float d = Half(src);
    uint32_t qh;
    __builtin_memcpy(&qh, src + 2, sizeof(qh));
    Store32(o.lv + 32 * b, _mm256_or_si256(Nibbles16(src + 6), Bits32(qh)));
    Fill8(o, 8 * b, d, 16.0f * d);
  }
}

// Q4_K and Q5_K (kFifth): 64 inputs per 32 bytes of qs, element l from the low nibble of byte l, 32
// + l from the high one; Q5_K's fifth bits are bits j and j + 1 of qh[l].
template <bool kFifth>
void Q45K(const uint8_t* src, int64_t nsb, const UnpackedSlice& o) {
  const __m256i low = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
  for (int64_t s = 0; s < nsb; ++s, src += kFifth ? 176 : 144) {
    const float d = Half(src), dmin = Half(src + 2);
    const uint8_t* q = src + (kFifth ? 48 : 16);
    const __m256i qh = kFifth ? Load32(src + 16) : _mm256_setzero_si256();
    uint8_t* lv = o.lv + 256 * s;
    for (int j = 0; j < 8; j += 2, q += 32, lv += 64) {
      const __m256i b = Load32(q);
      __m256i l0 = _mm256_and_si256(b, low), l1 = _mm256_and_si256(_mm256_srli_epi16(b, 4), low);
      if (kFifth) {
        const __m256i h = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(j));
        l0 = _mm256_or_si256(l0, _mm256_slli_epi16(_mm256_and_si256(h, one), 4));
        l1 = _mm256_or_si256(l1,
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 1), one), 4));
      }
      Store32(lv, l0);
      Store32(lv + 32, l1);
      for (int h = 0; h < 2; ++h) {
        int sc, mn;
        KScaleMinSimd(src + 4, j + h, &sc, &mn);
        Fill8(o, 64 * s + 8 * (j + h), d * float(sc), dmin * float(mn));
      }
    }
  }
}

void Q6K(const uint8_t* src, int64_t nsb, const UnpackedSlice& o) {
  const __m256i low = _mm256_set1_epi8(0xF), top = _mm256_set1_epi8(0x30);
  for (int64_t s = 0; s < nsb; ++s, src += 210) {
    const float d = Half(src + 208);
    for (int half = 0; half < 2; ++half) {
      const __m256i a = Load32(src + 64 * half), b = Load32(src + 64 * half + 32);
      const __m256i h = Load32(src + 128 + 32 * half);
      uint8_t* lv = o.lv + 256 * s + 128 * half;
      Store32(lv, _mm256_or_si256(_mm256_and_si256(a, low),
                                  _mm256_and_si256(_mm256_slli_epi16(h, 4), top)));
      Store32(lv + 32, _mm256_or_si256(_mm256_and_si256(b, low),
                                       _mm256_and_si256(_mm256_slli_epi16(h, 2), top)));
      Store32(lv + 64, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low),
                                       _mm256_and_si256(h, top)));
      Store32(lv + 96, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), low),
                                       _mm256_and_si256(_mm256_srli_epi16(h, 2), top)));
    }
    // Sub-block j of 16 inputs (4 lanes): w = d * sc[j] * (u - 32).
    const auto* sc = reinterpret_cast<const int8_t*>(src + 192);
    for (int j = 0; j < 16; ++j) {
      const float dj = d * float(sc[j]);
      _mm_storeu_ps(o.wsc + 64 * s + 4 * j, _mm_set1_ps(dj));
      o.wmn[16 * s + j] = 32.0f * dj;
    }
  }
}

}  // namespace

void DotTileAvx2(const DotTile& t) { DotTileSimd(t); }

bool UnpackSliceAvx2(int type_id, const uint8_t* src, int64_t blocks, const UnpackedSlice& out) {
  switch (type_id) {
    case 8: Q8_0(src, blocks, out); return true;
    case 2: Q4_0(src, blocks, out); return true;
    case 6: Q5_0(src, blocks, out); return true;
    case 12: Q45K<false>(src, blocks, out); return true;
    case 13: Q45K<true>(src, blocks, out); return true;
    case 14: Q6K(src, blocks, out); return true;
  }
  return false;
}

}  // namespace heavykv::cpu::internal
