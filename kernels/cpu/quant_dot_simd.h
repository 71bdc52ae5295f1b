// Internal to quant_dot_avx2.cc, quant_dot_avxvnni.cc, quant_dot_avx512.cc and
// quant_dot_avx512vnni.cc: the int8 dot kernel (quant_dot.h's DotTile) written once over a vector
// width, instantiated by each of those files under its own -m flags: 256-bit AVX2 (maddubs + madd)
// or AVX-VNNI (one 256-bit dpbusd), 512-bit AVX-512BW (maddubs + madd) or AVX512-VNNI (one dpbusd).
// Everything here has internal linkage, so no function compiled for a wider ISA can be picked by
// the linker for a narrower file's caller.
//
// Register blocking: a tile of R weight rows by C activation rows keeps R * C fp32 accumulators of
// one vector each; every weight chunk loaded is used C times and every activation chunk R times.
// Per chunk of 32 / 64 inputs and pair: an integer dot into 32-bit lanes (each the dot of 4 levels
// with 4 int8 activations), one conversion to fp32 and one fused multiply-add with the weight's
// lane scales (times the activation's lane scales, one multiply more, for the 32-input activation
// blocks; once per 256 inputs for the K-quants'); the offsets once per 256 inputs.
#pragma once

#include <immintrin.h>

// GCC 12 warns that AVX-512 intrinsics read an uninitialised value: its own _mm512_undefined_*()
// placeholder (GCC bug 105593), not ours.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <cstdint>

#include "kernels/cpu/quant_dot_kernel.h"

namespace heavykv::cpu::internal {
namespace {

#if defined(__AVX512F__)
using VI = __m512i;
using VF = __m512;
constexpr int kChunk = 64;  // inputs per vector of levels
inline VI LoadI(const void* p) { return _mm512_loadu_si512(p); }
inline VF LoadF(const float* p) { return _mm512_loadu_ps(p); }
inline VF ZeroF() { return _mm512_setzero_ps(); }
inline VF Cvt(VI v) { return _mm512_cvtepi32_ps(v); }
inline VF Mul(VF a, VF b) { return _mm512_mul_ps(a, b); }
inline VF Fma(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
inline VF Fnma(VF a, VF b, VF c) { return _mm512_fnmadd_ps(a, b, c); }
inline float Hsum(VF v) { return _mm512_reduce_add_ps(v); }
// Lane l: sum of u[4l + j] * a[4l + j], u unsigned, a signed (no 16-bit saturation when 2 * max(u)
// * 127 < 2^15, which holds for levels below 129).
inline VI DotU8S8(VI u, VI a) {
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, a);
#else
  return _mm512_madd_epi16(_mm512_maddubs_epi16(u, a), _mm512_set1_epi16(1));
#endif
}
inline VI Xor80(VI v) { return _mm512_xor_si512(v, _mm512_set1_epi8(char(0x80))); }
inline VI Abs8(VI v) { return _mm512_abs_epi8(v); }
// a negated where s < 0 (where s == 0 the other factor, |s|, is 0 anyway).
inline VI Sign8(VI a, VI s) {
  return _mm512_mask_sub_epi8(a, _mm512_movepi8_mask(s), _mm512_setzero_si512(), a);
}
inline VI DotAbs(VI abs_w, VI signed_a) {
  return _mm512_madd_epi16(_mm512_maddubs_epi16(abs_w, signed_a), _mm512_set1_epi16(1));
}
#else
using VI = __m256i;
using VF = __m256;
constexpr int kChunk = 32;
inline VI LoadI(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline VF LoadF(const float* p) { return _mm256_loadu_ps(p); }
inline VF ZeroF() { return _mm256_setzero_ps(); }
inline VF Cvt(VI v) { return _mm256_cvtepi32_ps(v); }
inline VF Mul(VF a, VF b) { return _mm256_mul_ps(a, b); }
inline VF Fma(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
inline VF Fnma(VF a, VF b, VF c) { return _mm256_fnmadd_ps(a, b, c); }
inline float Hsum(VF v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline VI DotU8S8(VI u, VI a) {
#if defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, a);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1));
#endif
}
inline VI Xor80(VI v) { return _mm256_xor_si256(v, _mm256_set1_epi8(char(0x80))); }
inline VI Abs8(VI v) { return _mm256_abs_epi8(v); }
inline VI Sign8(VI a, VI s) { return _mm256_sign_epi8(a, s); }
inline VI DotAbs(VI abs_w, VI signed_a) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, signed_a), _mm256_set1_epi16(1));
}
#endif

inline VF Set1(float v) {
#if defined(__AVX512F__)
  return _mm512_set1_ps(v);
#else
  return _mm256_set1_ps(v);
#endif
}
constexpr int kLanes = kChunk / 4;  // fp32 lanes per vector

// The integer dot of a chunk: lane l = sum of u[4l + j] * a[4l + j]. kSigned: u holds int8 + 128
// and the maddubs kernels take |w| times a with w's sign, which cannot saturate (VNNI's 32-bit
// dpbusd of the unsigned levels cannot either; the offset term then covers the + 128).
template <bool kSigned>
inline VI ChunkDot(VI u, VI a) {
#if !defined(__AVX512VNNI__) && !defined(__AVXVNNI__)
  if (kSigned) {
    const VI w = Xor80(u);
    return DotAbs(Abs8(w), Sign8(a, w));
  }
#endif
  return DotU8S8(u, a);
}

// Weight rows [r0, r0 + R) of the tile against activation rows [c0, c0 + C), in units of 256 inputs
// (kDotPad). k256: the activation's scale is one number per unit, so each pair sums dot * wsc over
// the unit and multiplies by it once.
template <int R, int C, bool kSigned, bool k256>
inline void TileRC(const DotTile& t, int r0, int c0) {
  constexpr bool kOffsets = !kSigned;  // the signed detour leaves no + 128 to take off
  VF acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = ZeroF();
  }
  const UnpackedSlice* w = t.w + r0;
  const int8_t* qs = t.qs + c0 * t.qs_stride;
  const float* scale = t.scale + c0 * t.scale_stride;
  const float* sum = t.sum + c0 * t.sum_stride;
  for (int64_t u0 = 0; u0 < t.len; u0 += kDotPad) {
    VF part[R][C];
    if (k256) {
      for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) part[r][c] = ZeroF();
      }
    }
    for (int64_t i = u0; i < u0 + kDotPad; i += kChunk) {
      const int64_t g = i / 4;
      VI u[R];
      VF ws[R];
      for (int r = 0; r < R; ++r) {
        u[r] = LoadI(w[r].lv + i);
        ws[r] = LoadF(w[r].wsc + g);
      }
      for (int c = 0; c < C; ++c) {
        const VI a = LoadI(qs + c * t.qs_stride + i);
        if (k256) {
          for (int r = 0; r < R; ++r) {
            part[r][c] = Fma(Cvt(ChunkDot<kSigned>(u[r], a)), ws[r], part[r][c]);
          }
        } else {
          const VF as = LoadF(scale + c * t.scale_stride + g);
          for (int r = 0; r < R; ++r) {
            acc[r][c] = Fma(Cvt(ChunkDot<kSigned>(u[r], a)), Mul(ws[r], as), acc[r][c]);
          }
        }
      }
    }
    if (k256) {
      for (int c = 0; c < C; ++c) {
        const VF as = Set1(scale[c * t.scale_stride + u0 / 4]);
        for (int r = 0; r < R; ++r) acc[r][c] = Fma(part[r][c], as, acc[r][c]);
      }
    }
    if (kOffsets) {
      for (int64_t h = u0 / 16; h < (u0 + kDotPad) / 16; h += kLanes) {
        for (int c = 0; c < C; ++c) {
          const VF sm = LoadF(sum + c * t.sum_stride + h);
          for (int r = 0; r < R; ++r) acc[r][c] = Fnma(LoadF(w[r].wmn + h), sm, acc[r][c]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) t.out[(r0 + r) * t.ldo + c0 + c] = Hsum(acc[r][c]);
  }
}

// Tile shapes (weight rows x activation rows) that keep the accumulators, the R weight chunks and
// their scales in registers: 32 zmm, or 16 ymm.
#if defined(__AVX512F__)
constexpr int kMaxR = 4, kMaxC256 = 2, kMaxC32 = 3;
#else
constexpr int kMaxR = 2, kMaxC256 = 2, kMaxC32 = 2;
#endif

template <int R, bool kSigned, bool k256>
inline void TileR(const DotTile& t, int r0) {
  constexpr int kMaxC = k256 ? kMaxC256 : kMaxC32;
  int c = 0;
  for (; c + kMaxC <= t.nc; c += kMaxC) TileRC<R, kMaxC, kSigned, k256>(t, r0, c);
  if (kMaxC > 2) {
    for (; c + 2 <= t.nc; c += 2) TileRC<R, 2, kSigned, k256>(t, r0, c);
  }
  for (; c < t.nc; ++c) TileRC<R, 1, kSigned, k256>(t, r0, c);
}

template <bool kSigned, bool k256>
inline void TileAll(const DotTile& t) {
  for (int r0 = 0; r0 < t.nr; r0 += kMaxR) {
    switch (t.nr - r0 < kMaxR ? t.nr - r0 : kMaxR) {
      case 1: TileR<1, kSigned, k256>(t, r0); break;
      case 2: TileR<2, kSigned, k256>(t, r0); break;
      case 3: TileR<3 < kMaxR ? 3 : kMaxR, kSigned, k256>(t, r0); break;
      default: TileR<kMaxR, kSigned, k256>(t, r0); break;
    }
  }
}

inline void DotTileSimd(const DotTile& t) {
#if defined(__AVX512VNNI__) || defined(__AVXVNNI__)
  constexpr bool kSignedPath = false;  // dpbusd's 32-bit sums need no signed detour
#else
  const bool kSignedPath = t.signed_levels;
#endif
  if (kSignedPath) {
    if (t.act_block256) {
      TileAll<true, true>(t);
    } else {
      TileAll<true, false>(t);
    }
  } else if (t.act_block256) {
    TileAll<false, true>(t);
  } else {
    TileAll<false, false>(t);
  }
}

}  // namespace
}  // namespace heavykv::cpu::internal
