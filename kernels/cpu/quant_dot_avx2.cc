// DotTileAvx2, PermuteLevelsAvx2 and FusedRowsAvx2 (quant_dot_kernel.h): the int8 dot kernel of
// quant_dot_simd.h for AVX2 (256-bit maddubs + madd), its lane order and the batch-1 fused
// decoders (quant_dot_fused256.h); and UnpackSliceAvx2: quant_dot.h's weight unpackers in AVX2 (a
// block's levels 32 bytes at a time: nibbles split with a mask and a shift, high bits spread with
// shifts or a byte shuffle and a compare), which the AVX-512 paths use too for the formats and
// slices their own decoders do not cover (Q5_0; k not a multiple of 256). This file is compiled
// with -mavx2 -mfma -mf16c (kernels/cpu/CMakeLists.txt) and must only be called where the CPU has
// them (quant_gemm.cc checks); it includes nothing with external linkage that another file could
// share.
#include "kernels/cpu/quant_dot_fused256.h"

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
// v[0..7] each twice, in order, at out[0..15].
inline void StoreTwice(float* out, __m256 v) {
  const __m256 lo = _mm256_unpacklo_ps(v, v), hi = _mm256_unpackhi_ps(v, v);
  _mm256_storeu_ps(out, _mm256_permute2f128_ps(lo, hi, 0x20));
  _mm256_storeu_ps(out + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
}
// The 8 six-bit scales and mins of a Q4_K / Q5_K block's 12 scale bytes (quant_kquants.h,
// KScaleMin) at once: bytes 0-3 and 4-7 hold sub-blocks 0-3's scales and mins in their low 6
// bits; sub-blocks 4-7 take their low 4 bits from bytes 8-11 and their top 2 from the top bits
// of bytes 0-3 (scales) and 4-7 (mins). Written times d and dmin as the scale and offset of each
// of the block's 16 groups of 16 (wsc[16], wmn[16]).
inline void KScalesMins(const uint8_t* s, float d, float dmin, float* wsc, float* wmn) {
  uint32_t a0, a1, a2;
  __builtin_memcpy(&a0, s, 4);
  __builtin_memcpy(&a1, s + 4, 4);
  __builtin_memcpy(&a2, s + 8, 4);
  const uint64_t sc = uint64_t(a0 & 0x3F3F3F3Fu) |
                      uint64_t((a2 & 0x0F0F0F0Fu) | (((a0 >> 6) & 0x03030303u) << 4)) << 32;
  const uint64_t mn = uint64_t(a1 & 0x3F3F3F3Fu) |
                      uint64_t(((a2 >> 4) & 0x0F0F0F0Fu) | (((a1 >> 6) & 0x03030303u) << 4)) << 32;
  const __m256 fs = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(sc))));
  const __m256 fm = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(mn))));
  StoreTwice(wsc, _mm256_mul_ps(fs, _mm256_set1_ps(d)));
  StoreTwice(wmn, _mm256_mul_ps(fm, _mm256_set1_ps(dmin)));
}
// The scale and offset of inputs [4g, 4g + 32): two groups of 16 in wsc and wmn.
inline void Fill8(const UnpackedSlice& o, int64_t g, float sc, float mn) {
  o.wsc[g / 4] = o.wsc[g / 4 + 1] = sc;
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
    KScalesMins(src + 4, Half(src), Half(src + 2), o.wsc + 16 * s, o.wmn + 16 * s);
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
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 192));
    const __m256 vd = _mm256_set1_ps(d), v32 = _mm256_set1_ps(32.0f);
    alignas(32) float dj[16];
    _mm256_store_ps(dj, _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
    _mm256_store_ps(
        dj + 8, _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
    _mm256_storeu_ps(o.wsc + 16 * s, _mm256_load_ps(dj));
    _mm256_storeu_ps(o.wsc + 16 * s + 8, _mm256_load_ps(dj + 8));
    _mm256_storeu_ps(o.wmn + 16 * s, _mm256_mul_ps(_mm256_load_ps(dj), v32));
    _mm256_storeu_ps(o.wmn + 16 * s + 8, _mm256_mul_ps(_mm256_load_ps(dj + 8), v32));
  }
}

}  // namespace

void DotTileAvx2(const DotTile& t) { DotTileSimd(t); }

bool FusedRowsAvx2(int type_id, const FusedRows& f) { return FusedRowsSimdFor(type_id, f); }

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

void PermuteLevelsAvx2(uint8_t* p, int64_t len) { PermuteLevelsSimd(p, len); }

}  // namespace heavykv::cpu::internal
