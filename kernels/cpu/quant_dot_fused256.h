// Internal to quant_dot_avx2.cc and quant_dot_avxvnni.cc: the 256-bit fused decoders
// (quant_dot_kernel.h, FusedRowsAvx2 / FusedRowsAvxVnni) for a batch of one. Each half of a run
// of 256 inputs (128: 8 groups of 16) is decoded in registers into the 4 chunks of levels in the
// 256-bit kernels' lane order (lane l of chunk k: inputs 4k..4k+3 of the half's group l) and its
// 8 group scales and offsets, as quant_dot_simd.h's 512-bit decoders do for the whole run. AVX2
// has no two-source word permute: each chunk is a one-source permute of each source and a blend.
// Internal linkage throughout, like quant_dot_simd.h.
#pragma once

#include "kernels/cpu/quant_dot_simd.h"

#if defined(__AVX512F__)
#error "quant_dot_fused256.h is for the 256-bit files only"
#endif

namespace heavykv::cpu::internal {
namespace {

// Words idx (one per lane) of v, shifted right per lane by sh bits, masked to `mask` per byte.
inline __m256i Words(__m256i v, __m256i idx, __m256i sh, __m256i mask) {
  return _mm256_and_si256(_mm256_srlv_epi32(_mm256_permutevar8x32_epi32(v, idx), sh), mask);
}
// (k, 4 + k) repeated: a group's chunk k and that of the next group of 16 inputs.
inline __m256i PairIdx(int k) {
  return _mm256_add_epi32(_mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4), _mm256_set1_epi32(k));
}
inline float HalfToFloat256(const uint8_t* p) {
  uint16_t h;
  __builtin_memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}
// 4 fp16 scales `stride` bytes apart from p, each twice (lane l: scale l / 2), as fp32: packed
// into one 64-bit word, one conversion of 4, one permute to pair them.
inline VF FourScalesTwice(const uint8_t* p, int64_t stride) {
  uint64_t packed = 0;
  for (int b = 0; b < 4; ++b) {
    uint16_t h;
    __builtin_memcpy(&h, p + b * stride, 2);
    packed |= uint64_t(h) << (16 * b);
  }
  const __m256 d = _mm256_castps128_ps256(_mm_cvtph_ps(_mm_cvtsi64_si128(int64_t(packed))));
  return _mm256_permutevar8x32_ps(d, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
}
// 4 bytes (the low ones of `b`), each twice, widened to 8 int32 lanes.
inline __m256i FourBytesTwice(uint32_t b) {
  const __m128i v = _mm_cvtsi32_si128(static_cast<int>(b));
  return _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(v, v));
}

// Q4_K: half h holds sub-blocks 4h..4h+3; lane l is half l % 2 of sub-block 4h + l / 2,
// whose levels are the low (even sub-block) or high nibbles of bytes 16 (l % 2) + 4k of the
// 32-byte chunk 2h + l / 4 of the 128 bytes of levels at q.
inline void KHalfScales(const uint8_t* blk, int h, VF* ws, VF* wm) {
  uint64_t sc, mn;
  KScaleMinBytes(blk, &sc, &mn);  // the half's 4 sub-blocks are bytes 4h..4h+3
  *ws = Mul(Set1F(HalfToFloat256(blk)), Cvt(FourBytesTwice(uint32_t(sc >> (32 * h)))));
  *wm = Mul(Set1F(HalfToFloat256(blk + 2)), Cvt(FourBytesTwice(uint32_t(mn >> (32 * h)))));
}
inline void KHalfNibbles(const uint8_t* q, int h, VI u[4]) {
  const __m256i q0 = LoadI(q + 64 * h), q1 = LoadI(q + 64 * h + 32);
  const __m256i sh = _mm256_setr_epi32(0, 0, 4, 4, 0, 0, 4, 4), low = _mm256_set1_epi8(0xF);
  for (int k = 0; k < 4; ++k) {
    const __m256i idx = PairIdx(k);
    const __m256i v = _mm256_blend_epi32(_mm256_permutevar8x32_epi32(q0, idx),
                                         _mm256_permutevar8x32_epi32(q1, idx), 0xF0);
    u[k] = _mm256_and_si256(_mm256_srlv_epi32(v, sh), low);
  }
}
struct DecodeQ4K256 {
  static constexpr int64_t kBytes = 144;
  static constexpr bool kSigned = false;
  void operator()(const uint8_t* blk, int h, VI u[4], VF* ws, VF* wm) const {
    KHalfScales(blk, h, ws, wm);
    KHalfNibbles(blk + 16, h, u);
  }
};
// Q5_K: Q4_K's scales and nibbles (levels at blk + 48) and a fifth bit per level from the 32
// bytes of qh at blk + 16: bit sb of qh[i] for input i of sub-block sb. Lane l (sub-block
// sb = 4h + l / 2, inputs 16 (l % 2) + 4k ..) takes word 4 (l % 2) + k of qh, whose bit sb is moved
// straight to bit 4 of each byte (left by 4 - sb in half 0, right by sb - 4 in half 1).
struct DecodeQ5K256 {
  static constexpr int64_t kBytes = 176;
  static constexpr bool kSigned = false;
  void operator()(const uint8_t* blk, int h, VI u[4], VF* ws, VF* wm) const {
    KHalfScales(blk, h, ws, wm);
    KHalfNibbles(blk + 48, h, u);
    const __m256i qh = LoadI(blk + 16), bit4 = _mm256_set1_epi8(0x10);
    const __m256i by = _mm256_setr_epi32(4, 4, 3, 3, 2, 2, 1, 1);  // 4 - sb in half 0
    const __m256i back = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);  // sb - 4 in half 1
    for (int k = 0; k < 4; ++k) {
      const __m256i v = _mm256_permutevar8x32_epi32(qh, PairIdx(k));
      const __m256i moved = h == 0 ? _mm256_sllv_epi32(v, by) : _mm256_srlv_epi32(v, back);
      u[k] = _mm256_or_si256(u[k], _mm256_and_si256(moved, bit4));
    }
  }
};
// Q6_K: lane l is sub-block 8h + l; its low 4 bits are word 4 (l % 2) + k of ql's 32 bytes
// 64h + 32 ((l / 2) % 2), shifted by 4 (l / 4); its top 2 bits word 4 (l % 2) + k of qh's 32 bytes
// 128 + 32h, shifted by 2 (l / 2).
struct DecodeQ6K256 {
  static constexpr int64_t kBytes = 210;
  static constexpr bool kSigned = false;
  void operator()(const uint8_t* blk, int h, VI u[4], VF* ws, VF* wm) const {
    *ws = Mul(Set1F(HalfToFloat256(blk + 208)),
              Cvt(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                  reinterpret_cast<const __m128i*>(blk + 192 + 8 * h)))));
    *wm = Mul(*ws, Set1F(32.0f));
    const __m256i l0 = LoadI(blk + 64 * h), l1 = LoadI(blk + 64 * h + 32);
    const __m256i qh = LoadI(blk + 128 + 32 * h);
    const __m256i lsh = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    const __m256i hsh = _mm256_setr_epi32(0, 0, 2, 2, 4, 4, 6, 6);
    const __m256i low = _mm256_set1_epi8(0xF), two = _mm256_set1_epi8(3);
    for (int k = 0; k < 4; ++k) {
      const __m256i idx = PairIdx(k);
      const __m256i lo = _mm256_and_si256(
          _mm256_srlv_epi32(_mm256_blend_epi32(_mm256_permutevar8x32_epi32(l0, idx),
                                               _mm256_permutevar8x32_epi32(l1, idx), 0xCC),
                            lsh),
          low);
      u[k] = _mm256_or_si256(lo, _mm256_slli_epi32(Words(qh, idx, hsh, two), 4));
    }
  }
};
// Q8_0: half h holds blocks 4h..4h+3 (34 bytes each); lane l is half l % 2 of block 4h + l / 2.
// Each block's 32 levels are two rows of 4 words (its two groups): the 8 rows, transposed, give
// the 4 chunks (unpacks within the 128-bit halves, then one word permute to interleave them).
struct DecodeQ8_0_256 {
  static constexpr int64_t kBytes = 8 * 34;
  static constexpr bool kSigned = true;
  void operator()(const uint8_t* blk, int h, VI u[4], VF* ws, VF* wm) const {
    const uint8_t* b = blk + 4 * 34 * h;
    *ws = FourScalesTwice(b, 34);
    *wm = Mul(*ws, Set1F(128.0f));
    __m256i z[4];
    for (int i = 0; i < 4; ++i) z[i] = Xor80(LoadI(b + 34 * i + 2));
    const __m256i t0 = _mm256_unpacklo_epi32(z[0], z[1]), t1 = _mm256_unpackhi_epi32(z[0], z[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(z[2], z[3]), t3 = _mm256_unpackhi_epi32(z[2], z[3]);
    const __m256i interleave = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    u[0] = _mm256_permutevar8x32_epi32(_mm256_unpacklo_epi64(t0, t2), interleave);
    u[1] = _mm256_permutevar8x32_epi32(_mm256_unpackhi_epi64(t0, t2), interleave);
    u[2] = _mm256_permutevar8x32_epi32(_mm256_unpacklo_epi64(t1, t3), interleave);
    u[3] = _mm256_permutevar8x32_epi32(_mm256_unpackhi_epi64(t1, t3), interleave);
  }
};
// Q4_0: half h holds blocks 4h..4h+3 (18 bytes each); lane l is the low (even l) or high
// nibbles of word k of block 4h + l / 2's 16 bytes of levels. Loaded as blocks (0, 2) and (1, 3)
// side by side, word k of each 128-bit half is broadcast within its half (an in-lane shuffle) and
// the two blended: lanes 0-1 / 4-5 from the first, 2-3 / 6-7 from the second; no cross-lane
// permute.
struct DecodeQ4_0_256 {
  static constexpr int64_t kBytes = 8 * 18;
  static constexpr bool kSigned = false;
  template <int k>
  static __m256i Chunk(__m256i even, __m256i odd, __m256i sh, __m256i low) {
    constexpr int kWord = _MM_SHUFFLE(k, k, k, k);
    const __m256i v = _mm256_blend_epi32(_mm256_shuffle_epi32(even, kWord),
                                         _mm256_shuffle_epi32(odd, kWord), 0xCC);
    return _mm256_and_si256(_mm256_srlv_epi32(v, sh), low);
  }
  void operator()(const uint8_t* blk, int h, VI u[4], VF* ws, VF* wm) const {
    const uint8_t* b = blk + 4 * 18 * h;
    *ws = FourScalesTwice(b, 18);
    *wm = Mul(*ws, Set1F(8.0f));
    auto levels = [&](int i) { return reinterpret_cast<const __m128i*>(b + 18 * i + 2); };
    const __m256i even = _mm256_loadu2_m128i(levels(2), levels(0));
    const __m256i odd = _mm256_loadu2_m128i(levels(3), levels(1));
    const __m256i sh = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4), low = _mm256_set1_epi8(0xF);
    u[0] = Chunk<0>(even, odd, sh, low);
    u[1] = Chunk<1>(even, odd, sh, low);
    u[2] = Chunk<2>(even, odd, sh, low);
    u[3] = Chunk<3>(even, odd, sh, low);
  }
};

// One activation row against each of the f.nr rows, a half-run of 128 inputs at a time.
template <class Decode>
inline void FusedRowsOneAct256(const FusedRows& f) {
  constexpr bool kOffsets = kNeedsOffsets<Decode::kSigned>;
  const Decode decode;
  for (int r = 0; r < f.nr; ++r) {
    VF acc = ZeroF(), off = ZeroF();  // two chains: the products and the offsets
    const uint8_t* blk = f.rows[r];
    for (int64_t s = 0; s < f.nsb; ++s, blk += Decode::kBytes) {
      for (int h = 0; h < 2; ++h) {
        const int8_t* q = f.qs + 256 * s + 128 * h;
        VI u[4];
        VF ws, wm;
        decode(blk, h, u, &ws, &wm);
        VI iacc = ChunkDotAdd<Decode::kSigned>(ZeroI(), u[0], LoadI(q));
        iacc = ChunkDotAdd<Decode::kSigned>(iacc, u[1], LoadI(q + 32));
        iacc = ChunkDotAdd<Decode::kSigned>(iacc, u[2], LoadI(q + 64));
        iacc = ChunkDotAdd<Decode::kSigned>(iacc, u[3], LoadI(q + 96));
        const int64_t g = 16 * s + 8 * h;
        acc = Fma(Cvt(iacc), Mul(ws, LoadF(f.scale + g)), acc);
        if (kOffsets) off = Fma(wm, LoadF(f.sum + g), off);
      }
    }
    f.out[r * f.ldo] = Hsum(acc) - Hsum(off);
  }
}

// Dispatches on the ggml type id; false (nothing done) for other types and for nc > 1.
// (GgmlType's ids, kernels/cpu/ggml_types.h: 2 Q4_0, 8 Q8_0, 12 Q4_K, 13 Q5_K, 14 Q6_K; the
// header is not included here, as nothing with external linkage may be.) Q5_K's decoder moves
// each fifth bit to bit 4 with one variable shift: 1.32x the AVX2 unpacker on one Zen 5 core
// (session 16); session 12's, which shifted the bit down, masked it and shifted it up, was slower
// than the unpacker on Zen 4 (8.7 against 9.9 GB/s). Not measured on Zen 4 since.
inline bool FusedRowsSimdFor(int type_id, const FusedRows& f) {
  if (f.nc != 1) return false;
  switch (type_id) {
    case 2: FusedRowsOneAct256<DecodeQ4_0_256>(f); return true;
    case 8: FusedRowsOneAct256<DecodeQ8_0_256>(f); return true;
    case 12: FusedRowsOneAct256<DecodeQ4K256>(f); return true;
    case 13: FusedRowsOneAct256<DecodeQ5K256>(f); return true;
    case 14: FusedRowsOneAct256<DecodeQ6K256>(f); return true;
  }
  return false;
}

}  // namespace
}  // namespace heavykv::cpu::internal
