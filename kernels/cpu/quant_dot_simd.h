// Internal to quant_dot_avx2.cc, quant_dot_avxvnni.cc, quant_dot_avx512.cc and
// quant_dot_avx512vnni.cc: the int8 dot kernel (quant_dot.h's DotTile) written once over a vector
// width, instantiated by each of those files under its own -m flags: 256-bit AVX2 (maddubs + madd)
// or AVX-VNNI (one 256-bit dpbusd), 512-bit AVX-512BW (maddubs + madd) or AVX512-VNNI (one dpbusd).
// Everything here has internal linkage, so no function compiled for a wider ISA can be picked by
// the linker for a narrower file's caller.
//
// Register blocking: a tile of R weight rows by C activation rows keeps R * C int32 and R * C fp32
// accumulators of one vector each; every weight chunk loaded is used C times and every activation
// chunk R times. Per chunk of 32 / 64 inputs and pair: one integer dot into 32-bit lanes (dpbusd,
// or maddubs + madd + add); per super-chunk of 4 chunks, in which each lane has summed one group
// of 16 inputs: one conversion, one multiply of the two sides' group scales, one fused
// multiply-add, and one more for the offsets.
//
// With AVX-512, Q4_0 / Q8_0 / Q4_K / Q5_K / Q6_K blocks are also decoded in registers straight
// into that lane order (2-source word permutes and per-lane shifts; FusedRows for small batches,
// DecodeSlice to write a slice for larger ones); the 256-bit decoders for a batch of one are in
// quant_dot_fused256.h.
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

inline VF Set1F(float v) {
#if defined(__AVX512F__)
  return _mm512_set1_ps(v);
#else
  return _mm256_set1_ps(v);
#endif
}
inline VI ZeroI() {
#if defined(__AVX512F__)
  return _mm512_setzero_si512();
#else
  return _mm256_setzero_si256();
#endif
}
inline VI AddI(VI a, VI b) {
#if defined(__AVX512F__)
  return _mm512_add_epi32(a, b);
#else
  return _mm256_add_epi32(a, b);
#endif
}
constexpr int kLanes = kChunk / 4;  // fp32 lanes per vector

// iacc + the integer dot of a chunk: lane l adds sum_j u[4l + j] * a[4l + j]. kSigned: u holds
// int8 + 128 and the maddubs kernels take |w| times a with w's sign, which cannot saturate
// (VNNI's 32-bit dpbusd of the unsigned levels cannot either; the offset term then covers the
// + 128).
template <bool kSigned>
inline VI ChunkDotAdd(VI iacc, VI u, VI a) {
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(iacc, u, a);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(iacc, u, a);
#else
  if (kSigned) {
    const VI w = Xor80(u);
    return AddI(iacc, DotAbs(Abs8(w), Sign8(a, w)));
  }
  return AddI(iacc, DotU8S8(u, a));
#endif
}

// Whether a kernel subtracts the offsets' term for levels of this signedness: dpbusd reads every
// level unsigned (Q8_0's int8 + 128) and needs it; the maddubs kernels take Q8_0's signed detour,
// which leaves no offset.
#if defined(__AVX512VNNI__) || defined(__AVXVNNI__)
template <bool kSigned>
inline constexpr bool kNeedsOffsets = true;
#else
template <bool kSigned>
inline constexpr bool kNeedsOffsets = !kSigned;
#endif

// The 8 sub-block scales and mins of a Q4_K / Q5_K super-block at blk, one byte each (sub-block
// j in byte j): the 12 bytes at blk + 4 hold sub-blocks 0-3 in the low 6 bits of bytes 0-3
// (scales) and 4-7 (mins), and 4-7 in the nibbles of bytes 8-11 and the top 2 bits of bytes 0-3 /
// 4-7 (quant_kquants.h). Scalar: the 512-bit and the 256-bit decoders share it.
inline void KScaleMinBytes(const uint8_t* blk, uint64_t* sc, uint64_t* mn) {
  uint32_t a0, a1, a2;
  __builtin_memcpy(&a0, blk + 4, 4);
  __builtin_memcpy(&a1, blk + 8, 4);
  __builtin_memcpy(&a2, blk + 12, 4);
  *sc = uint64_t(a0 & 0x3F3F3F3Fu) |
        uint64_t((a2 & 0x0F0F0F0Fu) | (((a0 >> 6) & 0x03030303u) << 4)) << 32;
  *mn = uint64_t(a1 & 0x3F3F3F3Fu) |
        uint64_t(((a2 >> 4) & 0x0F0F0F0Fu) | (((a1 >> 6) & 0x03030303u) << 4)) << 32;
}

// Inputs per super-chunk: kLanes groups of 16 inputs, laid out by PermuteLevels so that chunk k
// of it holds inputs 4k..4k+3 of group l in lane l. A lane's integer sums over the super-chunk's
// 4 chunks then all belong to one group of 16, which has one weight scale, one activation scale
// and one offset: 4 integer dots, one conversion and two fused multiply-adds per super-chunk.
constexpr int64_t kSuper = 16 * kLanes;

// In place, each super-chunk of `len` bytes (a multiple of kSuper) from natural order (4-byte word
// 4l + k = inputs 16l + 4k .. + 3) to the kernel's (word k * kLanes + l).
inline void PermuteLevelsSimd(uint8_t* p, int64_t len) {
  for (int64_t s = 0; s < len; s += kSuper, p += kSuper) {
#if defined(__AVX512F__)
    const __m512i z0 = LoadI(p), z1 = LoadI(p + 64), z2 = LoadI(p + 128), z3 = LoadI(p + 192);
    for (int k = 0; k < 4; ++k) {
      // Lane l < 8 takes word 4l + k of z0:z1, lane 8 + l word 4l + k of z2:z3.
      const __m512i idx = _mm512_add_epi32(
          _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28),
          _mm512_set1_epi32(k));
      const __m512i lo = _mm512_permutex2var_epi32(z0, idx, z1);
      const __m512i hi = _mm512_permutex2var_epi32(z2, idx, z3);
      _mm512_storeu_si512(p + 64 * k, _mm512_inserti64x4(lo, _mm512_castsi512_si256(hi), 1));
    }
#else
    // Each ymm holds groups 2i, 2i + 1: pair their words k (one qword per k), then transpose
    // the 4 x 4 qwords.
    const __m256i pair = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256i y[4];
    for (int i = 0; i < 4; ++i) y[i] = _mm256_permutevar8x32_epi32(LoadI(p + 32 * i), pair);
    const __m256i lo01 = _mm256_unpacklo_epi64(y[0], y[1]),
                  hi01 = _mm256_unpackhi_epi64(y[0], y[1]);
    const __m256i lo23 = _mm256_unpacklo_epi64(y[2], y[3]),
                  hi23 = _mm256_unpackhi_epi64(y[2], y[3]);
    auto* out = reinterpret_cast<__m256i*>(p);
    _mm256_storeu_si256(out + 0, _mm256_permute2x128_si256(lo01, lo23, 0x20));
    _mm256_storeu_si256(out + 1, _mm256_permute2x128_si256(hi01, hi23, 0x20));
    _mm256_storeu_si256(out + 2, _mm256_permute2x128_si256(lo01, lo23, 0x31));
    _mm256_storeu_si256(out + 3, _mm256_permute2x128_si256(hi01, hi23, 0x31));
#endif
  }
}

// Weight rows [r0, r0 + R) of the tile against activation rows [c0, c0 + C), one super-chunk at a
// time: R * C integer accumulators over its 4 chunks, then R * C fp32 ones over the slice.
template <int R, int C, bool kSigned>
inline void TileRC(const DotTile& t, int r0, int c0) {
  constexpr bool kOffsets = !kSigned;  // the signed detour leaves no + 128 to take off
  VF acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = ZeroF();
  }
  const UnpackedSlice* w = t.w + r0;
  const int8_t* qs = t.qs + c0 * t.qs_stride;
  const float* scale = t.scale + c0 * t.f_stride;
  const float* sum = t.sum + c0 * t.f_stride;
  for (int64_t s0 = 0; s0 < t.len; s0 += kSuper) {
    VI iacc[R][C];
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < C; ++c) iacc[r][c] = ZeroI();
    }
    for (int64_t i = s0; i < s0 + kSuper; i += kChunk) {
      VI a[C];
      for (int c = 0; c < C; ++c) a[c] = LoadI(qs + c * t.qs_stride + i);
      for (int r = 0; r < R; ++r) {
        const VI u = LoadI(w[r].lv + i);
        for (int c = 0; c < C; ++c) iacc[r][c] = ChunkDotAdd<kSigned>(iacc[r][c], u, a[c]);
      }
    }
    const int64_t h = s0 / 16;
    for (int r = 0; r < R; ++r) {
      const VF ws = LoadF(w[r].wsc + h);
      for (int c = 0; c < C; ++c) {
        acc[r][c] = Fma(Cvt(iacc[r][c]), Mul(ws, LoadF(scale + c * t.f_stride + h)), acc[r][c]);
        if (kOffsets) {
          acc[r][c] = Fnma(LoadF(w[r].wmn + h), LoadF(sum + c * t.f_stride + h), acc[r][c]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) t.out[(r0 + r) * t.ldo + c0 + c] = Hsum(acc[r][c]);
  }
}

// Tile shapes (weight rows x activation rows) that keep both kinds of accumulators and the
// activation chunks in registers: 32 zmm, or 16 ymm.
#if defined(__AVX512F__)
constexpr int kMaxR = 4, kMaxC = 2;
#else
constexpr int kMaxR = 2, kMaxC = 2;
#endif

template <int R, bool kSigned>
inline void TileR(const DotTile& t, int r0) {
  int c = 0;
  for (; c + kMaxC <= t.nc; c += kMaxC) TileRC<R, kMaxC, kSigned>(t, r0, c);
  if (kMaxC > 2) {
    for (; c + 2 <= t.nc; c += 2) TileRC<R, 2, kSigned>(t, r0, c);
  }
  for (; c < t.nc; ++c) TileRC<R, 1, kSigned>(t, r0, c);
}

template <bool kSigned>
inline void TileAll(const DotTile& t) {
  for (int r0 = 0; r0 < t.nr; r0 += kMaxR) {
    switch (t.nr - r0 < kMaxR ? t.nr - r0 : kMaxR) {
      case 1: TileR<1, kSigned>(t, r0); break;
      case 2: TileR<2, kSigned>(t, r0); break;
      case 3: TileR<(3 < kMaxR ? 3 : kMaxR), kSigned>(t, r0); break;
      default: TileR<kMaxR, kSigned>(t, r0); break;
    }
  }
}

#if defined(__AVX512F__)
// Small batches of weight rows straight from their blocks (quant_dot_kernel.h, FusedRows): each
// run of 256 inputs is decoded in registers into the 4 chunks of levels, in the kernel's lane
// order (lane g of chunk k: inputs 4k..4k+3 of group g of 16), and the 16 group scales and
// offsets; no unpacked copy is written or read back.

// Words w[g] + k of the 2-source table (t0, t1), each shifted right by sh[g] bits, masked to
// `mask` in every byte.
inline __m512i Gather(__m512i t0, __m512i t1, __m512i w, int k, __m512i sh, __m512i mask) {
  const __m512i v = _mm512_permutex2var_epi32(t0, _mm512_add_epi32(w, _mm512_set1_epi32(k)), t1);
  return _mm512_and_si512(_mm512_srlv_epi32(v, sh), mask);
}
inline float HalfToFloat(const uint8_t* p) {
  uint16_t h;
  __builtin_memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// The fp16 scales of 8 blocks `kStride` bytes apart (at blk, blk + kStride, ...), as fp32, each
// twice: lane g holds block g / 2's (its two groups of 16). The scales sit at even offsets, so a
// 16-bit word permute of the lines that hold them (two 64-byte loads per 128 bytes of blocks)
// picks them. A 16-lane gather is microcoded and slow on Zen 4, and eight scalar loads stored to
// the stack and read back as one vector cost Q4_0 a tenth of its speed on Zen 5 (the reload
// waits on the stores).
template <int64_t kStride>
inline VF BlockScales(const uint8_t* blk) {
  static_assert(kStride % 2 == 0 && 7 * kStride < 256);
  // Word indices, two to a 32-bit lane, of blocks b0 .. b0 + 3 starting `at` bytes into a pair.
  auto words = [](int at, int b) { return (at + (b + 1) * kStride) / 2 << 16 | (at + b * kStride) / 2; };
  __m512i h;
  if constexpr (7 * kStride < 128) {
    const __m512i idx = _mm512_setr_epi32(words(0, 0), words(0, 2), words(0, 4), words(0, 6), 0, 0,
                                          0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    h = _mm512_permutex2var_epi16(LoadI(blk), idx, LoadI(blk + 64));
  } else {
    // Blocks 0-3 from the first 128 bytes, 4-7 from the next 128 (block 4 at byte `hi` of them).
    constexpr int hi = 4 * kStride - 128;
    static_assert(hi >= 0 && hi + 3 * kStride < 128);
    const __m512i idx = _mm512_setr_epi32(words(0, 0), words(0, 2), words(hi, 0), words(hi, 2), 0,
                                          0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i lo = _mm512_permutex2var_epi16(LoadI(blk), idx, LoadI(blk + 64));
    h = _mm512_mask_blend_epi32(0xC, lo,
                                _mm512_permutex2var_epi16(LoadI(blk + 128), idx, LoadI(blk + 192)));
  }
  const __m256 d = _mm256_cvtph_ps(_mm512_castsi512_si128(h));
  const __m512i twice = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  return _mm512_permutexvar_ps(twice, _mm512_castps256_ps512(d));
}

// The 16 group scales of Q4_K and Q5_K (group g: sub-block g / 2): d * scale and dmin * min,
// from the 12 bytes of 6-bit scales and mins at blk + 4 (KScaleMinBytes).
inline void KScalesMins(const uint8_t* blk, VF* ws, VF* wm) {
  uint64_t sc, mn;
  KScaleMinBytes(blk, &sc, &mn);
  const __m512i twice = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  *ws = Mul(
      Set1F(HalfToFloat(blk)),
      Cvt(_mm512_permutexvar_epi32(twice, _mm512_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(sc))))));
  *wm = Mul(
      Set1F(HalfToFloat(blk + 2)),
      Cvt(_mm512_permutexvar_epi32(twice, _mm512_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(mn))))));
}

// The low 4 bits of Q4_K and Q5_K levels, from the 128 bytes at q: group g is half g % 2 of
// sub-block g / 2, whose levels are the low (even sub-block) or high (odd) nibbles of
// q[32 (g / 4) ..]: word 8 (g / 4) + 4 (g % 2) + k of q.
inline void KNibbles(const uint8_t* q, VI u[4]) {
  const __m512i words =
      _mm512_setr_epi32(0, 4, 0, 4, 8, 12, 8, 12, 16, 20, 16, 20, 24, 28, 24, 28);
  const __m512i shifts = _mm512_setr_epi32(0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4);
  const __m512i q0 = LoadI(q), q1 = LoadI(q + 64), low = _mm512_set1_epi8(0xF);
  for (int k = 0; k < 4; ++k) u[k] = Gather(q0, q1, words, k, shifts, low);
}

// Q4_K (144 bytes): scales and mins, then the nibbles of its 128 bytes of levels at blk + 16.
struct DecodeQ4K {
  static constexpr int64_t kBytes = 144;
  static constexpr bool kSigned = false;
  void operator()(const uint8_t* blk, VI u[4], VF* ws, VF* wm) const {
    KScalesMins(blk, ws, wm);
    KNibbles(blk + 16, u);
  }
};

// Q5_K (176 bytes): Q4_K's scales and nibbles (at blk + 48), and a fifth bit per level from the
// 32 bytes of qh at blk + 16: bit sb of qh[l] for input l of sub-block sb, so group g (sub-block
// g / 2, inputs 16 (g % 2) + 4k ..) takes bit g / 2 of word 4 (g % 2) + k of qh.
struct DecodeQ5K {
  static constexpr int64_t kBytes = 176;
  static constexpr bool kSigned = false;
  void operator()(const uint8_t* blk, VI u[4], VF* ws, VF* wm) const {
    KScalesMins(blk, ws, wm);
    KNibbles(blk + 48, u);
    const __m512i qh = _mm512_castsi256_si512(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16)));
    const __m512i words = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
    const __m512i shifts = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512i one = _mm512_set1_epi8(1);
    for (int k = 0; k < 4; ++k) {
      u[k] = _mm512_or_si512(u[k], _mm512_slli_epi32(Gather(qh, qh, words, k, shifts, one), 4));
    }
  }
};

// Q4_0 (8 blocks of 18 bytes per 256 inputs): group g is half g % 2 of block g / 2, the low
// (even g) or high nibbles of its 16 bytes of levels, w = d * (u - 8). The 8 blocks' levels are
// packed into two vectors (blocks 0-3, 4-7), where block b's word j is word 4b + j of the pair:
// group g's chunk k is word 4 (g / 2) + k, shifted by 4 (g % 2).
struct DecodeQ4_0 {
  static constexpr int64_t kBytes = 8 * 18;
  static constexpr bool kSigned = false;
  void operator()(const uint8_t* blk, VI u[4], VF* ws, VF* wm) const {
    *ws = BlockScales<18>(blk);
    *wm = Mul(*ws, Set1F(8.0f));
    auto levels = [&](int b) {
      return _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18 * b + 2));
    };
    __m512i q[2];
    for (int h = 0; h < 2; ++h) {
      q[h] = _mm512_castsi128_si512(levels(4 * h));
      q[h] = _mm512_inserti32x4(q[h], levels(4 * h + 1), 1);
      q[h] = _mm512_inserti32x4(q[h], levels(4 * h + 2), 2);
      q[h] = _mm512_inserti32x4(q[h], levels(4 * h + 3), 3);
    }
    const __m512i words =
        _mm512_setr_epi32(0, 0, 4, 4, 8, 8, 12, 12, 16, 16, 20, 20, 24, 24, 28, 28);
    const __m512i shifts = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
    const __m512i low = _mm512_set1_epi8(0xF);
    for (int k = 0; k < 4; ++k) u[k] = Gather(q[0], q[1], words, k, shifts, low);
  }
};

// Q6_K (210 bytes): group g is sub-block g (its own int8 scale); its half is g / 8 and its
// quarter (g % 8) / 2: low 4 bits from word 16 (g / 8) + 8 (quarter % 2) + 4 (g % 2) + k of ql,
// shifted by 4 (quarter / 2); top 2 bits from word 8 (g / 8) + 4 (g % 2) + k of qh, shifted by
// 2 quarter.
struct DecodeQ6K {
  static constexpr int64_t kBytes = 210;
  static constexpr bool kSigned = false;
  void operator()(const uint8_t* blk, VI u[4], VF* ws, VF* wm) const {
    const VF d = Set1F(HalfToFloat(blk + 208));
    *ws = Mul(
        d, Cvt(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)))));
    *wm = Mul(*ws, Set1F(32.0f));
    const __m512i lw = _mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 16, 20, 24, 28, 16, 20, 24, 28);
    const __m512i ls = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 0, 0, 4, 4, 4, 4);
    const __m512i hw = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 8, 12, 8, 12, 8, 12, 8, 12);
    const __m512i hs = _mm512_setr_epi32(0, 0, 2, 2, 4, 4, 6, 6, 0, 0, 2, 2, 4, 4, 6, 6);
    const __m512i ql0 = LoadI(blk), ql1 = LoadI(blk + 64), qh = LoadI(blk + 128);
    const __m512i low = _mm512_set1_epi8(0xF), two = _mm512_set1_epi8(3);
    for (int k = 0; k < 4; ++k) {
      const __m512i lo = Gather(ql0, ql1, lw, k, ls, low);
      const __m512i hi = Gather(qh, qh, hw, k, hs, two);
      u[k] = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 4));
    }
  }
};

// Q8_0 (8 blocks of 34 bytes per 256 inputs): group g is half g % 2 of block g / 2; its levels are
// the int8 values + 128, and the block's fp16 d scales both halves.
struct DecodeQ8_0 {
  static constexpr int64_t kBytes = 8 * 34;
  static constexpr bool kSigned = true;
  void operator()(const uint8_t* blk, VI u[4], VF* ws, VF* wm) const {
    *ws = BlockScales<34>(blk);
    *wm = Mul(*ws, Set1F(128.0f));
    // Blocks 2i, 2i + 1 side by side: natural order, 64 inputs a vector, then into lane order.
    __m512i z[4];
    for (int i = 0; i < 4; ++i) {
      const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 68 * i + 2));
      const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 68 * i + 36));
      z[i] = Xor80(_mm512_inserti64x4(_mm512_castsi256_si512(b0), b1, 1));
    }
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    for (int k = 0; k < 4; ++k) {
      const __m512i at = _mm512_add_epi32(idx, _mm512_set1_epi32(k));
      const __m512i lo = _mm512_permutex2var_epi32(z[0], at, z[1]);
      const __m512i hi = _mm512_permutex2var_epi32(z[2], at, z[3]);
      u[k] = _mm512_inserti64x4(lo, _mm512_castsi512_si256(hi), 1);
    }
  }
};

// One activation row (a batch-1 decode) against row r: the activation chunks, scales and sums
// loaded once per run of 256 inputs and kept in registers beside the decoded levels (about 1.3x
// the general loop below at m = 1 on Zen 4: Q4_K 10.6 -> 15.5 GB/s on one core). Interleaving
// several rows was slower: their streams defeat the hardware prefetcher.
template <class Decode, bool kOffsets>
inline void FusedRowOneAct(const FusedRows& f, int r) {
  const Decode decode;
  VF acc = ZeroF();
  const uint8_t* blk = f.rows[r];
  for (int64_t s = 0; s < f.nsb; ++s, blk += Decode::kBytes) {
    const int8_t* q = f.qs + 256 * s;
    VI u[4];
    VF ws, wm;
    decode(blk, u, &ws, &wm);
    VI iacc = ChunkDotAdd<Decode::kSigned>(ZeroI(), u[0], LoadI(q));
    iacc = ChunkDotAdd<Decode::kSigned>(iacc, u[1], LoadI(q + 64));
    iacc = ChunkDotAdd<Decode::kSigned>(iacc, u[2], LoadI(q + 128));
    iacc = ChunkDotAdd<Decode::kSigned>(iacc, u[3], LoadI(q + 192));
    acc = Fma(Cvt(iacc), Mul(ws, LoadF(f.scale + 16 * s)), acc);
    if (kOffsets) acc = Fnma(wm, LoadF(f.sum + 16 * s), acc);
  }
  f.out[r * f.ldo] = Hsum(acc);
}

template <class Decode>
inline void FusedRowsSimd(const FusedRows& f) {
  constexpr bool kOffsets = kNeedsOffsets<Decode::kSigned>;
  const Decode decode;
  if (f.nc == 1) {
    for (int r = 0; r < f.nr; ++r) FusedRowOneAct<Decode, kOffsets>(f, r);
    return;
  }
  for (int r = 0; r < f.nr; ++r) {
    // Activation rows 4 at a time (4 accumulators); each group decodes the row again.
    for (int c0 = 0; c0 < f.nc; c0 += 4) {
      const int nc = f.nc - c0 < 4 ? f.nc - c0 : 4;
      VF acc[4] = {ZeroF(), ZeroF(), ZeroF(), ZeroF()};
      const uint8_t* blk = f.rows[r];
      for (int64_t s = 0; s < f.nsb; ++s, blk += Decode::kBytes) {
        VI u[4];
        VF ws, wm;
        decode(blk, u, &ws, &wm);
        const int64_t h = 16 * s;
        for (int c = 0; c < nc; ++c) {
          const int8_t* q = f.qs + (c0 + c) * f.qs_stride + 256 * s;
          VI iacc = ZeroI();
          for (int k = 0; k < 4; ++k) {
            iacc = ChunkDotAdd<Decode::kSigned>(iacc, u[k], LoadI(q + 64 * k));
          }
          const float* scale = f.scale + (c0 + c) * f.f_stride + h;
          acc[c] = Fma(Cvt(iacc), Mul(ws, LoadF(scale)), acc[c]);
          if (kOffsets) acc[c] = Fnma(wm, LoadF(f.sum + (c0 + c) * f.f_stride + h), acc[c]);
        }
      }
      for (int c = 0; c < nc; ++c) f.out[r * f.ldo + c0 + c] = Hsum(acc[c]);
    }
  }
}

// The decoders writing an unpacked slice (UnpackedSlice, already in the kernel's lane order) for
// batches that reuse it: nsb runs of 256 inputs from src.
template <class Decode>
inline void DecodeSliceSimd(const uint8_t* src, int64_t nsb, const UnpackedSlice& out) {
  const Decode decode;
  for (int64_t s = 0; s < nsb; ++s, src += Decode::kBytes) {
    VI u[4];
    VF ws, wm;
    decode(src, u, &ws, &wm);
    for (int k = 0; k < 4; ++k) _mm512_storeu_si512(out.lv + 256 * s + 64 * k, u[k]);
    _mm512_storeu_ps(out.wsc + 16 * s, ws);
    _mm512_storeu_ps(out.wmn + 16 * s, wm);
  }
}

inline bool DecodeSliceSimdFor(int type_id, const uint8_t* src, int64_t nsb,
                               const UnpackedSlice& out) {
  switch (type_id) {
    case 2: DecodeSliceSimd<DecodeQ4_0>(src, nsb, out); return true;
    case 12: DecodeSliceSimd<DecodeQ4K>(src, nsb, out); return true;
    case 13: DecodeSliceSimd<DecodeQ5K>(src, nsb, out); return true;
    case 14: DecodeSliceSimd<DecodeQ6K>(src, nsb, out); return true;
    case 8: DecodeSliceSimd<DecodeQ8_0>(src, nsb, out); return true;
  }
  return false;
}

// Dispatches on the ggml type id; false where there is no fused decoder.
// (GgmlType's ids, kernels/cpu/ggml_types.h: 2 Q4_0, 8 Q8_0, 12 Q4_K, 13 Q5_K, 14 Q6_K; the
// header is not included here, as nothing with external linkage may be.)
inline bool FusedRowsSimdFor(int type_id, const FusedRows& f) {
  switch (type_id) {
    case 2: FusedRowsSimd<DecodeQ4_0>(f); return true;
    case 12: FusedRowsSimd<DecodeQ4K>(f); return true;
    case 13: FusedRowsSimd<DecodeQ5K>(f); return true;
    case 14: FusedRowsSimd<DecodeQ6K>(f); return true;
    case 8: FusedRowsSimd<DecodeQ8_0>(f); return true;
  }
  return false;
}
#endif

inline void DotTileSimd(const DotTile& t) {
#if defined(__AVX512VNNI__) || defined(__AVXVNNI__)
  TileAll<false>(t);  // dpbusd's 32-bit sums need no signed detour
#else
  if (t.signed_levels) {
    TileAll<true>(t);
  } else {
    TileAll<false>(t);
  }
#endif
}

}  // namespace
}  // namespace heavykv::cpu::internal
