// The AVX2 + FMA path of PagedAttention (paged_attention.h), for CPUs without AVX-512. The same
// arithmetic and order of passes as the AVX-512 path with 8-lane vectors: the q.k dot products of
// 8 slots are finished together by one transpose-add, exp is a vector polynomial, a tile of
// queries (a prefill chunk's) and the heads of a GQA group share one walk over the pages, and
// the H2O score add is fused into the p.v walk.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cpu/paged_attention_paths.h"

namespace heavykv::cpu::internal {
namespace {


// 8 elements (chunk c) of a K/V row as fp32: a load; for bf16 a widening load and a 16-bit
// shift; for int8 a sign-extending load and a conversion (the row's scale is applied by the
// caller); for int4 8 nibbles of the chunk's group (chunk 4k + j: bytes 8 (j % 2) .. of group k,
// low nibbles for j < 2, high ones above), less 8, times the group's fp16 scale.
__attribute__((target("avx2,fma"))) inline __m256 Load8(const float* row, int c) {
  return _mm256_loadu_ps(row + c * 8);
}
__attribute__((target("avx2,fma"))) inline __m256 Load8(const uint16_t* row, int c) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c * 8));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
template <typename F>
__attribute__((target("avx2,fma,f16c"), always_inline)) inline __m256 LoadQuant8(QuantRow row,
                                                                               int c) {
  if constexpr (F::kRowScale) {  // int8
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row.data + c * 8));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
  } else {  // int4
    const int k = c >> 2, j = c & 3;
    const __m128i b =
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row.data + k * 16 + (j & 1) * 8));
    const __m128i nib = _mm_and_si128(j >= 2 ? _mm_srli_epi16(b, 4) : b, _mm_set1_epi8(0x0F));
    const __m256i q = _mm256_sub_epi32(_mm256_cvtepu8_epi32(nib), _mm256_set1_epi32(8));
    uint16_t h;
    __builtin_memcpy(&h, row.scale + k * 2, 2);
    return _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(_cvtsh_ss(h)));
  }
}
template <typename F>
__attribute__((target("avx2,fma,f16c"), always_inline)) inline __m256 LoadRow8(
    typename F::Row row, int c) {
  if constexpr (std::is_same_v<typename F::Row, QuantRow>) {
    return LoadQuant8<F>(row, c);
  } else {
    return Load8(row, c);
  }
}

// Lanes [0, count) set.
__attribute__((target("avx2,fma"))) inline __m256i FirstLanes(int32_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(count),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Loads and stores of the first `count` lanes: a plain access for a whole vector (vmaskmov is
// several times slower on AMD Zen, where this path runs), masked for the tail.
__attribute__((target("avx2,fma"))) inline __m256 LoadFirst(const float* p, int32_t count) {
  return count >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, FirstLanes(count));
}
__attribute__((target("avx2,fma"))) inline void StoreFirst(float* p, int32_t count, __m256 v) {
  if (count >= 8) {
    _mm256_storeu_ps(p, v);
  } else {
    _mm256_maskstore_ps(p, FirstLanes(count), v);
  }
}

// out[i] = sum of the 8 lanes of v[i], for 8 vectors.
__attribute__((target("avx2,fma"))) inline __m256 Sum8x8(const __m256 (&v)[8]) {
  const __m256 a0 = _mm256_hadd_ps(v[0], v[1]), a1 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 a2 = _mm256_hadd_ps(v[4], v[5]), a3 = _mm256_hadd_ps(v[6], v[7]);
  // b0: rows 0-3, one half-sum per 128-bit lane; b1: rows 4-7.
  const __m256 b0 = _mm256_hadd_ps(a0, a1), b1 = _mm256_hadd_ps(a2, a3);
  return _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20), _mm256_permute2f128_ps(b0, b1, 0x31));
}

__attribute__((target("avx2,fma"))) inline float HorizontalMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}
__attribute__((target("avx2,fma"))) inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// e^x for x <= 0 (softmax arguments), relative error ~2e-7: x = n ln2 + r with |r| <= ln2/2,
// e^r by a degree-6 Taylor polynomial, 2^n built in the exponent bits; 0 below -87 (where 2^n
// would leave the normal range), as the AVX-512 path's vscalefps flushes.
__attribute__((target("avx2,fma"))) inline __m256 Exp(__m256 x) {
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                           _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(two_n)), tiny);
}

// Adds to one head's sums of p[r] * V row r, chunks [c0, c0 + C) of the page's rows (row(r): the
// handle of row r), the rows [0, rows): with C <= 4, two accumulator sets (even and odd slots)
// keep enough FMA chains in flight, else `even` alone. An int8 row's scale multiplies its
// probability.
template <typename F, int C>
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void AccumulateRows(
    const PagedKvHead& kv, int32_t page, int32_t c0, const float* p, int32_t rows,
    __m256 (&even)[C], __m256 (&odd)[C]) {
  int32_t r = 0;
  if constexpr (C <= 4) {
    for (; r + 1 < rows; r += 2) {
      const typename F::Row v0 = F::PageRow(kv, false, page, r);
      const typename F::Row v1 = F::PageRow(kv, false, page, r + 1);
      const __m256 p0 = _mm256_set1_ps(p[r] * F::RowScale(v0));
      const __m256 p1 = _mm256_set1_ps(p[r + 1] * F::RowScale(v1));
      for (int c = 0; c < C; ++c) {
        even[c] = _mm256_fmadd_ps(p0, LoadRow8<F>(v0, c0 + c), even[c]);
        odd[c] = _mm256_fmadd_ps(p1, LoadRow8<F>(v1, c0 + c), odd[c]);
      }
    }
  }
  for (; r < rows; ++r) {
    const typename F::Row v0 = F::PageRow(kv, false, page, r);
    const __m256 p0 = _mm256_set1_ps(p[r] * F::RowScale(v0));
    for (int c = 0; c < C; ++c) even[c] = _mm256_fmadd_ps(p0, LoadRow8<F>(v0, c0 + c), even[c]);
  }
}

// Adds to the H2O scores of a page's slots [s0, s0 + rows) the probability each received from
// all G heads of the group (probs: [G][n]).
__attribute__((target("avx2,fma"))) inline void AddReceived(const PagedKvHead& kv, int32_t page,
                                                           int32_t s0, int32_t rows,
                                                           const float* probs, int32_t n,
                                                           int32_t G) {
  float* score = kv.score + page * kv.meta_page_stride;
  for (int32_t r = 0; r < rows; r += 8) {
    const int32_t count = rows - r;
    __m256 received = LoadFirst(probs + s0 + r, count);
    for (int32_t g = 1; g < G; ++g) {
      received = _mm256_add_ps(received, LoadFirst(probs + int64_t(g) * n + s0 + r, count));
    }
    StoreFirst(score + r, count, _mm256_add_ps(LoadFirst(score + r, count), received));
  }
}

// out[8 * C] = sum over slots s < n of p[s] * V row s, columns [col0, col0 + 8 * C). With
// kScores the same walk adds to each slot's H2O score the probability it received from all G
// heads of the group (probs: [G][n]), while that page's V rows stream in.
template <typename F, int C, bool kScores>
__attribute__((target("avx2,fma,f16c"))) void WeightedSumOfV(const PagedKvHead& kv,
                                                            const float* p, int32_t n,
                                                            int32_t col0, float* out,
                                                            const float* probs, int32_t G) {
  __m256 even[C], odd[C];
  for (int c = 0; c < C; ++c) even[c] = odd[c] = _mm256_setzero_ps();
  const int32_t bs = kv.block_size;
  for (int32_t s0 = 0; s0 < n; s0 += bs) {
    PrefetchRows<F>(kv, false, s0 + kPrefetchSlots, bs, n);
    const int32_t page = kv.pages[s0 / bs];
    const int32_t rows = std::min(bs, n - s0);
    if constexpr (kScores) AddReceived(kv, page, s0, rows, probs, n, G);
    AccumulateRows<F, C>(kv, page, col0 / 8, p + s0, rows, even, odd);
  }
  for (int c = 0; c < C; ++c) {
    _mm256_storeu_ps(out + c * 8, C <= 4 ? _mm256_add_ps(even[c], odd[c]) : even[c]);
  }
}

// The same for every (query, head) pair of a tile, nq queries x G heads (2 <= pairs <=
// kMaxTilePairs), in one walk over the V pages: each page's rows are read from memory once and
// then serve every pair from L1 (a walk per head reads a long context's V once per pair). Query
// i sees n[i] slots; its probabilities are probs[i] ([G][n[i]]); its output rows are out + i *
// out_stride + g * head_dim; its H2O scores are added when add[i]. Each pair's sums live in
// `acc` between pages and take the FMAs of WeightedSumOfV in the same order, so the result is
// bit for bit what the pair gets alone.
template <typename F, int C>
__attribute__((target("avx2,fma,f16c"))) void WeightedSumsOfPairs(
    const PagedKvHead& kv, const float* const* probs, const int32_t* n, int32_t nq, int32_t G,
    int32_t col0, float* out, int64_t out_stride, const bool* add) {
  alignas(32) float acc[kMaxTilePairs * 2 * 8 * C];
  std::fill(acc, acc + int64_t(nq) * G * 2 * 8 * C, 0.0f);
  const int32_t bs = kv.block_size, hd = kv.head_dim, n_end = n[nq - 1];
  for (int32_t s0 = 0; s0 < n_end; s0 += bs) {
    PrefetchRows<F>(kv, false, s0 + kPrefetchSlots, bs, n_end);
    const int32_t page = kv.pages[s0 / bs];
    for (int32_t i = 0; i < nq; ++i) {
      const int32_t rows = std::min(bs, n[i] - s0);
      if (rows <= 0) continue;
      if (add[i]) AddReceived(kv, page, s0, rows, probs[i], n[i], G);
      for (int32_t g = 0; g < G; ++g) {
        float* ag = acc + (int64_t(i) * G + g) * 2 * 8 * C;
        __m256 even[C], odd[C];
        for (int c = 0; c < C; ++c) {
          even[c] = _mm256_load_ps(ag + c * 8);
          odd[c] = _mm256_load_ps(ag + (C + c) * 8);
        }
        AccumulateRows<F, C>(kv, page, col0 / 8, probs[i] + int64_t(g) * n[i] + s0, rows, even,
                             odd);
        for (int c = 0; c < C; ++c) {
          _mm256_store_ps(ag + c * 8, even[c]);
          _mm256_store_ps(ag + (C + c) * 8, odd[c]);
        }
      }
    }
  }
  for (int32_t i = 0; i < nq; ++i) {
    for (int32_t g = 0; g < G; ++g) {
      const float* ag = acc + (int64_t(i) * G + g) * 2 * 8 * C;
      float* og = out + i * out_stride + int64_t(g) * hd + col0;
      for (int c = 0; c < C; ++c) {
        const __m256 e = _mm256_load_ps(ag + c * 8);
        const __m256 o = _mm256_load_ps(ag + (C + c) * 8);
        _mm256_storeu_ps(og + c * 8, C <= 4 ? _mm256_add_ps(e, o) : e);
      }
    }
  }
}

// One head's p.v over columns [col0, col0 + 8 * chunks), chunks in 1..8.
template <typename F, bool kScores>
__attribute__((target("avx2,fma,f16c"))) void WeightedSumBlock(
    int chunks, const PagedKvHead& kv, const float* p, int32_t n, int32_t col0, float* out,
    const float* probs, int32_t G) {
  switch (chunks) {
    case 1: WeightedSumOfV<F, 1, kScores>(kv, p, n, col0, out, probs, G); break;
    case 2: WeightedSumOfV<F, 2, kScores>(kv, p, n, col0, out, probs, G); break;
    case 3: WeightedSumOfV<F, 3, kScores>(kv, p, n, col0, out, probs, G); break;
    case 4: WeightedSumOfV<F, 4, kScores>(kv, p, n, col0, out, probs, G); break;
    case 5: WeightedSumOfV<F, 5, kScores>(kv, p, n, col0, out, probs, G); break;
    case 6: WeightedSumOfV<F, 6, kScores>(kv, p, n, col0, out, probs, G); break;
    case 7: WeightedSumOfV<F, 7, kScores>(kv, p, n, col0, out, probs, G); break;
    default: WeightedSumOfV<F, 8, kScores>(kv, p, n, col0, out, probs, G); break;
  }
}

// The pairs' walk over columns [col0, col0 + 8 * chunks), chunks in 1..8.
template <typename F>
__attribute__((target("avx2,fma,f16c"))) void WeightedSumsOfPairsBlock(
    int chunks, const PagedKvHead& kv, const float* const* probs, const int32_t* n, int32_t nq,
    int32_t G, int32_t col0, float* out, int64_t out_stride, const bool* add) {
  switch (chunks) {
    case 1: WeightedSumsOfPairs<F, 1>(kv, probs, n, nq, G, col0, out, out_stride, add); break;
    case 2: WeightedSumsOfPairs<F, 2>(kv, probs, n, nq, G, col0, out, out_stride, add); break;
    case 3: WeightedSumsOfPairs<F, 3>(kv, probs, n, nq, G, col0, out, out_stride, add); break;
    case 4: WeightedSumsOfPairs<F, 4>(kv, probs, n, nq, G, col0, out, out_stride, add); break;
    case 5: WeightedSumsOfPairs<F, 5>(kv, probs, n, nq, G, col0, out, out_stride, add); break;
    case 6: WeightedSumsOfPairs<F, 6>(kv, probs, n, nq, G, col0, out, out_stride, add); break;
    case 7: WeightedSumsOfPairs<F, 7>(kv, probs, n, nq, G, col0, out, out_stride, add); break;
    default: WeightedSumsOfPairs<F, 8>(kv, probs, n, nq, G, col0, out, out_stride, add); break;
  }
}

// p[0..n) = softmax(p[0..n)); with `stats`, p = exp(p - max) unnormalised and stats[0], stats[1]
// = the max and the sum (a part of a split context).
__attribute__((target("avx2,fma"))) void SoftmaxRow(float* p, int32_t n, float* stats) {
  __m256 mx = _mm256_set1_ps(-INFINITY);
  int32_t s = 0;
  for (; s + 8 <= n; s += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(p + s));
  if (s < n) {
    const __m256i m = FirstLanes(n - s);
    mx = _mm256_max_ps(mx, _mm256_blendv_ps(mx, _mm256_maskload_ps(p + s, m),
                                            _mm256_castsi256_ps(m)));
  }
  const __m256 vmax = _mm256_set1_ps(HorizontalMax(mx));
  __m256 sum = _mm256_setzero_ps();
  for (s = 0; s < n; s += 8) {
    const int32_t count = n - s;
    __m256 e = Exp(_mm256_sub_ps(LoadFirst(p + s, count), vmax));
    if (count < 8) e = _mm256_and_ps(e, _mm256_castsi256_ps(FirstLanes(count)));
    sum = _mm256_add_ps(sum, e);
    StoreFirst(p + s, count, e);
  }
  if (stats != nullptr) {
    stats[0] = _mm256_cvtss_f32(vmax);
    stats[1] = HorizontalSum(sum);
    return;
  }
  const __m256 inv = _mm256_set1_ps(1.0f / HorizontalSum(sum));
  for (s = 0; s < n; s += 8) {
    StoreFirst(p + s, n - s, _mm256_mul_ps(LoadFirst(p + s, n - s), inv));
  }
}

// Queries [q0, q0 + nq) (nq * group <= kMaxTilePairs, or nq = 1), as the AVX-512 path's tile:
// each 8-slot block of K rows and each page of V rows read once for all the tile's pairs, each
// pair's arithmetic what it gets alone. scratch: query i's probabilities [G][n_i] one after
// another, n_i = num_old + q0 + i + 1.
template <typename F>
__attribute__((target("avx2,fma,f16c"))) void AttendTile(const AttentionArgs& a, int32_t q0,
                                                         int32_t nq, float* scratch) {
  const PagedKvHead& kv = a.kv;
  const int32_t hd = kv.head_dim, G = a.group;
  const int32_t chunks = hd / 8;
  const __m256 scale = _mm256_set1_ps(1.0f / std::sqrt(static_cast<float>(hd)));
  float* probs[kMaxTilePairs] = {};
  int32_t n[kMaxTilePairs] = {};
  bool add[kMaxTilePairs] = {};
  for (int32_t i = 0; i < nq; ++i) {
    n[i] = a.num_old + q0 + i + 1;
    probs[i] = i == 0 ? scratch : probs[i - 1] + int64_t(G) * n[i - 1];
    add[i] = FusesScoreAdd(a, q0 + i);
  }
  const int32_t n_end = n[nq - 1];
  // Logits, 8 slots at a time (a block of 8 may span pages when block_size < 8).
  for (int32_t s0 = 0; s0 < n_end; s0 += 8) {
    PrefetchRows<F>(kv, true, s0 + kPrefetchSlots, 8, n_end);
    const int32_t last = std::min(8, n_end - s0) - 1;
    typename F::Row k[8];
    for (int32_t r = 0; r < 8; ++r) k[r] = F::At(kv, true, s0 + std::min(r, last));
    // An int8 row's scale multiplies its finished dot product, with the softmax's.
    __m256 kscale = scale;
    if constexpr (F::kRowScale) {
      alignas(32) float rs[8];
      for (int32_t r = 0; r < 8; ++r) rs[r] = F::RowScale(k[r]);
      kscale = _mm256_mul_ps(_mm256_load_ps(rs), scale);
    }
    for (int32_t i = 0; i < nq; ++i) {
      if (n[i] <= s0) continue;
      const float* q = a.q + (q0 + i) * a.q_stride;
      for (int32_t g = 0; g < G; ++g) {
        const float* qg = q + int64_t(g) * hd;
        __m256 acc[8];
        for (int32_t r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
        for (int32_t c = 0; c < chunks; ++c) {
          const __m256 qc = _mm256_loadu_ps(qg + c * 8);
          for (int32_t r = 0; r < 8; ++r) {
            acc[r] = _mm256_fmadd_ps(qc, LoadRow8<F>(k[r], c), acc[r]);
          }
        }
        StoreFirst(probs[i] + int64_t(g) * n[i] + s0, n[i] - s0,
                   _mm256_mul_ps(Sum8x8(acc), kscale));
      }
    }
  }
  for (int32_t i = 0; i < nq; ++i) {
    for (int32_t g = 0; g < G; ++g) {
      float* stats =
          a.part_stats != nullptr ? a.part_stats + (int64_t(q0 + i) * G + g) * 2 : nullptr;
      SoftmaxRow(probs[i] + int64_t(g) * n[i], n[i], stats);
    }
  }
  // out = sum_s p[s] * v_s in blocks of up to 64 columns (8 accumulators), and the H2O scores
  // (added in the first block's walk).
  if (nq * G > 1 && nq * G <= kMaxTilePairs) {
    const bool none[kMaxTilePairs] = {};
    for (int32_t c0 = 0; c0 < chunks; c0 += 8) {
      WeightedSumsOfPairsBlock<F>(std::min(8, chunks - c0), kv, probs, n, nq, G, c0 * 8,
                                  a.out + q0 * a.out_stride, a.out_stride, c0 == 0 ? add : none);
    }
    return;
  }
  // One query, a group of 1 or over kMaxTilePairs: a walk per head, the sums in registers; the
  // scores are added during the last head's first block, when all G rows of probs are final.
  float* out = a.out + q0 * a.out_stride;
  const float* p0 = probs[0];
  const int32_t n0 = n[0];
  for (int32_t g = 0; g < G; ++g) {
    const float* p = p0 + int64_t(g) * n0;
    float* og = out + int64_t(g) * hd;
    for (int32_t c0 = 0; c0 < chunks; c0 += 8) {
      const int block = std::min(8, chunks - c0);
      if (add[0] && g == G - 1 && c0 == 0) {
        WeightedSumBlock<F, true>(block, kv, p, n0, c0 * 8, og + c0 * 8, p0, G);
      } else {
        WeightedSumBlock<F, false>(block, kv, p, n0, c0 * 8, og + c0 * 8, p0, G);
      }
    }
  }
}

}  // namespace

bool Avx2Handles(const AttentionArgs& args) { return args.kv.head_dim % 8 == 0; }

void AttendTileAvx2(const AttentionArgs& args, int32_t q0, int32_t nq, float* scratch) {
  if (args.kv.quant == KvQuant::kInt8) {
    AttendTile<Int8Kv>(args, q0, nq, scratch);
  } else if (args.kv.quant == KvQuant::kInt4) {
    AttendTile<Int4Kv>(args, q0, nq, scratch);
  } else if (args.kv.bf16()) {
    AttendTile<Bf16Kv>(args, q0, nq, scratch);
  } else {
    AttendTile<FloatKv>(args, q0, nq, scratch);
  }
}

}  // namespace heavykv::cpu::internal
