// Internal to quant_dot_avx2.cc, quant_dot_avx512.cc and quant_dot_avx512vnni.cc: the int8 dot
// kernel (quant_dot.h's DotTile) written once over a vector width, instantiated by each of those
// files under its own -m flags: 256-bit AVX2 (maddubs + madd), 512-bit AVX-512BW (the same at
// twice the width) or AVX512-VNNI (one dpbusd). Everything here has internal linkage, so no
// function compiled for a wider ISA can be picked by the linker for a narrower file's caller.
//
// Register blocking: a tile of R <= 4 weight rows by C activation rows keeps R * C fp32
// accumulators of one vector each; every weight chunk loaded is used C times and every
// activation chunk R times. Per chunk and pair: an integer dot into 32-bit lanes (each the dot
// of 4 levels with 4 int8 activations), one conversion to fp32, one multiply of the two sides'
// lane scales, and one fused multiply-add each for the dot and the weight's offset term.
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
constexpr int kMaxC = 3;    // activation rows per tile: 12 accumulators of 32 zmm
inline VI LoadI(const void* p) { return _mm512_loadu_si512(p); }
inline VF LoadF(const float* p) { return _mm512_loadu_ps(p); }
inline VF ZeroF() { return _mm512_setzero_ps(); }
inline VF Cvt(VI v) { return _mm512_cvtepi32_ps(v); }
inline VF Mul(VF a, VF b) { return _mm512_mul_ps(a, b); }
inline VF Fma(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
inline VF Fnma(VF a, VF b, VF c) { return _mm512_fnmadd_ps(a, b, c); }
inline float Hsum(VF v) { return _mm512_reduce_add_ps(v); }
// Lane l: sum of u[4l + j] * a[4l + j], u unsigned, a signed (no 16-bit saturation when
// 2 * max(u) * 127 < 2^15, which holds for levels below 129).
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
constexpr int kMaxC = 2;  // 8 accumulators of 16 ymm
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
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1));
}
inline VI Xor80(VI v) { return _mm256_xor_si256(v, _mm256_set1_epi8(char(0x80))); }
inline VI Abs8(VI v) { return _mm256_abs_epi8(v); }
inline VI Sign8(VI a, VI s) { return _mm256_sign_epi8(a, s); }
inline VI DotAbs(VI abs_w, VI signed_a) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, signed_a), _mm256_set1_epi16(1));
}
#endif

// Rows [0, R) of the tile against activation rows [c0, c0 + C). kSigned: the levels are int8
// values + 128 (Q8_0) and the maddubs kernels take their dot with the signed values (|w| times
// a with w's sign), which cannot saturate; the offset term then drops out.
template <int R, int C, bool kSigned>
inline void TileRC(const DotTile& t, int c0) {
  VF acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = ZeroF();
  }
  const int8_t* qs = t.qs + c0 * t.qs_stride;
  const float* scale = t.scale + c0 * t.f_stride;
  const float* sum = t.sum + c0 * t.f_stride;
  for (int64_t i = 0; i < t.len; i += kChunk) {
    const int64_t g = i / 4;
    VI u[R];
    VF ws[R];
    for (int r = 0; r < R; ++r) {
      u[r] = LoadI(t.w[r].lv + i);
      if (kSigned) u[r] = Xor80(u[r]);
      ws[r] = LoadF(t.w[r].wsc + g);
    }
    for (int c = 0; c < C; ++c) {
      const VI a = LoadI(qs + c * t.qs_stride + i);
      const VF as = LoadF(scale + c * t.f_stride + g);
      if (kSigned) {
        for (int r = 0; r < R; ++r) {
          const VI d = DotAbs(Abs8(u[r]), Sign8(a, u[r]));
          acc[r][c] = Fma(Cvt(d), Mul(ws[r], as), acc[r][c]);
        }
      } else {
        const VF sm = LoadF(sum + c * t.f_stride + g);
        for (int r = 0; r < R; ++r) {
          const VI d = DotU8S8(u[r], a);
          acc[r][c] = Fma(Cvt(d), Mul(ws[r], as), acc[r][c]);
          acc[r][c] = Fnma(LoadF(t.w[r].wmn + g), sm, acc[r][c]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) t.out[r * t.ldo + c0 + c] = Hsum(acc[r][c]);
  }
}

template <int R, bool kSigned>
inline void TileR(const DotTile& t) {
  int c = 0;
  for (; c + kMaxC <= t.nc; c += kMaxC) TileRC<R, kMaxC, kSigned>(t, c);
  if (kMaxC > 2) {
    for (; c + 2 <= t.nc; c += 2) TileRC<R, 2, kSigned>(t, c);
  }
  for (; c < t.nc; ++c) TileRC<R, 1, kSigned>(t, c);
}

template <bool kSigned>
inline void TileSigned(const DotTile& t) {
  switch (t.nr) {
    case 1: TileR<1, kSigned>(t); break;
    case 2: TileR<2, kSigned>(t); break;
    case 3: TileR<3, kSigned>(t); break;
    default: TileR<4, kSigned>(t); break;
  }
}

// VNNI's dpbusd accumulates in 32 bits, so the unsigned levels + offset term never saturate.
inline void DotTileSimd(const DotTile& t) {
#if defined(__AVX512VNNI__)
  TileSigned<false>(t);
#else
  if (t.signed_levels) {
    TileSigned<true>(t);
  } else {
    TileSigned<false>(t);
  }
#endif
}

}  // namespace
}  // namespace heavykv::cpu::internal
