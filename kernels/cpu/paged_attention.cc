#include "kernels/cpu/paged_attention.h"

#include "kernels/cpu/paged_attention_paths.h"
#include "kernels/cpu/quant_dot.h"

#include <immintrin.h>

// GCC 12 warns that the AVX-512 shuffle intrinsics read an uninitialised value: its own
// _mm512_undefined_ps() placeholder (GCC bug 105593), not ours.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

namespace heavykv::cpu {
namespace {

using internal::kPrefetchSlots;
using internal::PrefetchRows;

// The portable path: compiled for AVX-512, AVX2 and baseline x86-64, chosen at load time by CPU
// features (not by CPU model, as "arch=" clones would), so one binary is portable; it serves the
// head sizes that the hand-written paths (below, and paged_attention_avx2.cc) do not take. The
// inner loops are written for the auto-vectoriser; `omp simd` lets it reorder the float sums.
#define HEAVYKV_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))

// Element d of a K/V row, as fp32.
inline float Elem(const float* row, int32_t d) { return row[d]; }
inline float Elem(const uint16_t* row, int32_t d) { return Bf16ToFloat(row[d]); }

// probs[g][0..n) = softmax of each of the group's rows of logits of query qi; for a part of a
// split context left unnormalised, exp(l - max), with the max and the sum in part_stats.
__attribute__((always_inline)) inline void SoftmaxRowsPortable(const AttentionArgs& a,
                                                               int32_t qi, float* probs,
                                                               int32_t n) {
  for (int32_t g = 0; g < a.group; ++g) {
    float* p = probs + int64_t(g) * n;
    float mx = p[0];
    for (int32_t s = 1; s < n; ++s) mx = std::max(mx, p[s]);
    float sum = 0.0f;
    for (int32_t s = 0; s < n; ++s) {
      p[s] = expf(p[s] - mx);
      sum += p[s];
    }
    if (a.part_stats != nullptr) {  // a part of a split context: left unnormalised
      float* stats = a.part_stats + (int64_t(qi) * a.group + g) * 2;
      stats[0] = mx;
      stats[1] = sum;
      continue;
    }
    const float inv = 1.0f / sum;
    for (int32_t s = 0; s < n; ++s) p[s] *= inv;
  }
}

// T: the element type of the K/V rows (float, or uint16_t holding bf16).
template <typename T>
__attribute__((always_inline)) inline void AttendOneQueryBody(const AttentionArgs& a, int32_t qi,
                                                              float* probs) {
  const PagedKvHead& kv = a.kv;
  const int32_t hd = kv.head_dim, bs = kv.block_size, G = a.group;
  const int32_t n = a.num_old + qi + 1;  // visible slots
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* q = a.q + qi * a.q_stride;

  // logits: probs[g * n + s] = q_g . k_s / sqrt(hd), walking the block table page by page so
  // that each page's K rows are read once for the whole group.
  for (int32_t s0 = 0; s0 < n; s0 += bs) {
    const T* kpage = internal::PlainKv<T>::Base(kv, true) + kv.pages[s0 / bs] * kv.page_stride;
    const int32_t rows = std::min(bs, n - s0);
    for (int32_t r = 0; r < rows; ++r) {
      const T* k = kpage + int64_t(r) * hd;
      for (int32_t g = 0; g < G; ++g) {
        const float* qg = q + int64_t(g) * hd;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int32_t d = 0; d < hd; ++d) dot += qg[d] * Elem(k, d);
        probs[int64_t(g) * n + s0 + r] = dot * scale;
      }
    }
  }
  SoftmaxRowsPortable(a, qi, probs, n);
  // out_g = sum_s p_g[s] * v_s, again page by page; the same pass adds each slot's probability,
  // summed over the group, to its H2O score.
  float* out = a.out + qi * a.out_stride;
  std::fill(out, out + int64_t(G) * hd, 0.0f);
  for (int32_t s0 = 0; s0 < n; s0 += bs) {
    const int32_t page = kv.pages[s0 / bs];
    const T* vpage = internal::PlainKv<T>::Base(kv, false) + page * kv.page_stride;
    float* score = internal::FusesScoreAdd(a, qi) ? kv.score + page * kv.meta_page_stride : nullptr;
    const int32_t rows = std::min(bs, n - s0);
    for (int32_t r = 0; r < rows; ++r) {
      const T* v = vpage + int64_t(r) * hd;
      float received = 0.0f;
      for (int32_t g = 0; g < G; ++g) {
        const float pg = probs[int64_t(g) * n + s0 + r];
        received += pg;
        float* og = out + int64_t(g) * hd;
        for (int32_t d = 0; d < hd; ++d) og[d] += pg * Elem(v, d);
      }
      if (score != nullptr) score[r] += received;
    }
  }
}

// The portable path for quantized K/V: the same passes as AttendOneQueryBody, each row
// dequantized into a head_dim buffer as it is reached (DequantizeKvRow), never a whole page.
HEAVYKV_MULTIVERSION
void AttendOneQueryQuant(const AttentionArgs& a, int32_t qi, float* probs) {
  const PagedKvHead& kv = a.kv;
  const int32_t hd = kv.head_dim, G = a.group;
  const int32_t n = a.num_old + qi + 1;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* q = a.q + qi * a.q_stride;
  thread_local std::vector<float> row;
  row.resize(hd);
  for (int32_t s = 0; s < n; ++s) {
    DequantizeKvRow(kv.quant, kv.kq + kv.QRowOffset(s), kv.ksc + kv.QScaleOffset(s), hd,
                    row.data());
    for (int32_t g = 0; g < G; ++g) {
      const float* qg = q + int64_t(g) * hd;
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int32_t d = 0; d < hd; ++d) dot += qg[d] * row[d];
      probs[int64_t(g) * n + s] = dot * scale;
    }
  }
  SoftmaxRowsPortable(a, qi, probs, n);
  float* out = a.out + qi * a.out_stride;
  std::fill(out, out + int64_t(G) * hd, 0.0f);
  const bool add = internal::FusesScoreAdd(a, qi);
  for (int32_t s = 0; s < n; ++s) {
    DequantizeKvRow(kv.quant, kv.vq + kv.QRowOffset(s), kv.vsc + kv.QScaleOffset(s), hd,
                    row.data());
    float received = 0.0f;
    for (int32_t g = 0; g < G; ++g) {
      const float pg = probs[int64_t(g) * n + s];
      received += pg;
      float* og = out + int64_t(g) * hd;
      for (int32_t d = 0; d < hd; ++d) og[d] += pg * row[d];
    }
    if (add) kv.Score(s) += received;
  }
}

HEAVYKV_MULTIVERSION
void AttendOneQuery(const AttentionArgs& a, int32_t qi, float* probs) {
  AttendOneQueryBody<float>(a, qi, probs);
}
HEAVYKV_MULTIVERSION
void AttendOneQueryBf16(const AttentionArgs& a, int32_t qi, float* probs) {
  AttendOneQueryBody<uint16_t>(a, qi, probs);
}

// --- AVX-512 path: the same arithmetic, with the q.k dot products of 16 slots finished
// together and a vector exp. The portable loop above spends most of a decode's attention in
// one horizontal reduction per slot and a scalar expf per probability.

// out[i] = sum of the 16 lanes of v[i], for 16 vectors: four rounds of pairwise shuffles.
__attribute__((target("avx512f"))) inline __m512 Sum16x16(__m512 v[16]) {
  __m512 a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i) {  // rows 2i, 2i+1 interleaved in each 128-bit lane
    a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
  for (int i = 0; i < 4; ++i) {  // rows 4i..4i+3 in each 128-bit lane
    b[i] = _mm512_add_ps(_mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0x44),
                         _mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0xEE));
  }
  for (int i = 0; i < 2; ++i) {  // rows 8i..8i+3 in lanes 0-1, 8i+4..8i+7 in lanes 2-3
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xEE));
  }
  return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88),
                       _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
}

// e^x for x <= 0 (softmax arguments), relative error ~2e-7: x = n ln2 + r with |r| <= ln2/2,
// e^r by a degree-6 Taylor polynomial, 2^n by vscalefps (which also flushes to 0 for x < -104).
__attribute__((target("avx512f"))) inline __m512 Exp(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // r = x - n ln2, ln2 split in two so that r is exact to float precision.
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// 16 elements (chunk c) of a K/V row as fp32: a load; for bf16 a widening load and a 16-bit
// shift; for int8 a sign-extending load and a conversion (the row's scale is applied by the
// caller); for int4 the chunk's nibbles of its group's 16 bytes (chunk 2k: the low ones of group
// k, 2k + 1: the high ones), less 8, times the group's fp16 scale.
__attribute__((target("avx512f"))) inline __m512 Load16(const float* row, int c) {
  return _mm512_loadu_ps(row + c * 16);
}
__attribute__((target("avx512f"))) inline __m512 Load16(const uint16_t* row, int c) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + c * 16));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
template <typename F>
__attribute__((target("avx512f,f16c"), always_inline)) inline __m512 LoadQuant16(
    internal::QuantRow row, int c) {
  if constexpr (F::kRowScale) {  // int8
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row.data + c * 16));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
  } else {  // int4
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row.data + (c >> 1) * 16));
    const __m128i nib = _mm_and_si128(c & 1 ? _mm_srli_epi16(b, 4) : b, _mm_set1_epi8(0x0F));
    const __m512i q = _mm512_sub_epi32(_mm512_cvtepu8_epi32(nib), _mm512_set1_epi32(8));
    uint16_t h;
    __builtin_memcpy(&h, row.scale + (c >> 1) * 2, 2);
    return _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(_cvtsh_ss(h)));
  }
}
template <typename F>
__attribute__((target("avx512f,f16c"), always_inline)) inline __m512 LoadRow16(
    typename F::Row row, int c) {
  if constexpr (std::is_same_v<typename F::Row, internal::QuantRow>) {
    return LoadQuant16<F>(row, c);
  } else {
    return Load16(row, c);
  }
}

// probs[s0 + r] = q . k(s0 + r) * scale for r < rows, from the 16 rows k[0..15] (16 * C floats
// of q): the 16 dot products finished together by Sum16x16 (then times each row's scale, int8).
template <typename F, int C>
__attribute__((target("avx512f,f16c"), always_inline)) inline void Logits16(
    const float* q, const typename F::Row (&k)[16], int32_t rows, __m512 scale, float* out) {
  __m512 qv[C];
  for (int c = 0; c < C; ++c) qv[c] = _mm512_loadu_ps(q + c * 16);
  __m512 acc[16];
  for (int32_t r = 0; r < 16; ++r) {
    acc[r] = _mm512_mul_ps(qv[0], LoadRow16<F>(k[r], 0));
    for (int c = 1; c < C; ++c) acc[r] = _mm512_fmadd_ps(qv[c], LoadRow16<F>(k[r], c), acc[r]);
  }
  const __mmask16 mask = rows >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << rows) - 1);
  __m512 sums = Sum16x16(acc);
  if constexpr (F::kRowScale) {
    alignas(64) float rs[16];
    for (int32_t r = 0; r < 16; ++r) rs[r] = F::RowScale(k[r]);
    sums = _mm512_mul_ps(sums, _mm512_load_ps(rs));
  }
  _mm512_mask_storeu_ps(out, mask, _mm512_mul_ps(sums, scale));
}

// int8 rows with AVX512-VNNI (head_dim a multiple of 64): q.k as integer dot products. The
// query (one head) is quantized to int8 once per call, q ~ sq * q8 (sq = max|q| / 127, as
// llama.cpp's q8_0 cache quantizes its activations); vpdpbusd multiplies unsigned by signed
// bytes, so the keys enter as k + 128 (a xor of the sign bit) and 128 * sum(q8) is taken off
// after. The integer sums are exact (each lane < 2^24 before the exact Sum16x16), so the only
// rounding is q's. probs[s0 + r] = sq * 2^e_r * (q8 . k8_r) * scale for r < rows.
struct QuantizedQuery {
  alignas(64) int8_t q8[128];
  float sq = 0.0f;
  int32_t sum = 0;  // sum of q8
};
inline void QuantizeQuery(const float* q, int32_t hd, QuantizedQuery* out) {
  float amax = 0.0f;
  for (int32_t d = 0; d < hd; ++d) amax = std::max(amax, std::fabs(q[d]));
  out->sq = amax / 127.0f;
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  out->sum = 0;
  for (int32_t d = 0; d < hd; ++d) {
    const float v = std::fmax(-127.0f, std::fmin(127.0f, std::nearbyint(q[d] * inv)));
    out->q8[d] = static_cast<int8_t>(v);
    out->sum += out->q8[d];
  }
}
template <int C>
__attribute__((target("avx512f,avx512bw,avx512vnni"), noinline)) void LogitsVnni16(
    const QuantizedQuery& q, const internal::QuantRow (&k)[16], int32_t rows, __m512 scale,
    float* out) {
  constexpr int kChunks = C / 4;  // 64 bytes each
  __m512i qv[kChunks];
  for (int c = 0; c < kChunks; ++c) qv[c] = _mm512_load_si512(q.q8 + c * 64);
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[16];
  for (int32_t r = 0; r < 16; ++r) {
    __m512i sum = _mm512_setzero_si512();
    for (int c = 0; c < kChunks; ++c) {
      const __m512i kb = _mm512_xor_si512(_mm512_loadu_si512(k[r].data + c * 64), sign);
      sum = _mm512_dpbusd_epi32(sum, kb, qv[c]);
    }
    acc[r] = _mm512_cvtepi32_ps(sum);
  }
  alignas(64) float rs[16];
  for (int32_t r = 0; r < 16; ++r) rs[r] = internal::Int8Kv::RowScale(k[r]);
  const __m512 dots = _mm512_sub_ps(Sum16x16(acc), _mm512_set1_ps(128.0f * float(q.sum)));
  const __m512 f = _mm512_mul_ps(_mm512_load_ps(rs), _mm512_mul_ps(_mm512_set1_ps(q.sq), scale));
  const __mmask16 mask = rows >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << rows) - 1);
  _mm512_mask_storeu_ps(out, mask, _mm512_mul_ps(dots, f));
}

// p[0..n) = softmax(p[0..n)), with the vector exp; with `stats`, p = exp(p - max) unnormalised
// and stats[0], stats[1] = the max and the sum (a part of a split context).
__attribute__((target("avx512f"))) inline void SoftmaxRow(float* p, int32_t n, float* stats) {
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int32_t s = 0; s < n; s += 16) {
    const __mmask16 m = n - s >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - s)) - 1);
    mx = _mm512_mask_max_ps(mx, m, mx, _mm512_maskz_loadu_ps(m, p + s));
  }
  const __m512 vmax = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512 sum = _mm512_setzero_ps();
  for (int32_t s = 0; s < n; s += 16) {
    const __mmask16 m = n - s >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - s)) - 1);
    const __m512 e =
        _mm512_maskz_mov_ps(m, Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, p + s), vmax)));
    sum = _mm512_add_ps(sum, e);
    _mm512_mask_storeu_ps(p + s, m, e);
  }
  if (stats != nullptr) {
    stats[0] = _mm512_cvtss_f32(vmax);
    stats[1] = _mm512_reduce_add_ps(sum);
    return;
  }
  const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
  for (int32_t s = 0; s < n; s += 16) {
    const __mmask16 m = n - s >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - s)) - 1);
    _mm512_mask_storeu_ps(p + s, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, p + s), inv));
  }
}

// Adds to the H2O scores of a page's slots [s0, s0 + rows) the probability each received from
// all G heads of the group (probs: [G][n]).
__attribute__((target("avx512f"))) inline void AddReceived(const PagedKvHead& kv, int32_t page,
                                                           int32_t s0, int32_t rows,
                                                           const float* probs, int32_t n,
                                                           int32_t G) {
  float* score = kv.score + page * kv.meta_page_stride;
  for (int32_t r = 0; r < rows; r += 16) {
    const __mmask16 m = rows - r >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (rows - r)) - 1);
    __m512 received = _mm512_maskz_loadu_ps(m, probs + s0 + r);
    for (int32_t g = 1; g < G; ++g) {
      received =
          _mm512_add_ps(received, _mm512_maskz_loadu_ps(m, probs + int64_t(g) * n + s0 + r));
    }
    const __m512 sum = _mm512_add_ps(_mm512_maskz_loadu_ps(m, score + r), received);
    _mm512_mask_storeu_ps(score + r, m, sum);
  }
}

// even/odd[16 * C] += p[r] * V row r of one page (row(r) its handle), for r < rows: even rows
// into `even`, odd ones into `odd`, so consecutive FMAs into one register do not wait on each
// other. An int8 row's scale multiplies its probability.
template <typename F, int C, typename RowOf>
__attribute__((target("avx512f,f16c"), always_inline)) inline void AccumulateRows(
    RowOf row, const float* p, int32_t rows, __m512 (&even)[C], __m512 (&odd)[C]) {
  int32_t r = 0;
  for (; r + 1 < rows; r += 2) {
    const typename F::Row v0 = row(r), v1 = row(r + 1);
    const __m512 p0 = _mm512_set1_ps(p[r] * F::RowScale(v0));
    const __m512 p1 = _mm512_set1_ps(p[r + 1] * F::RowScale(v1));
    for (int c = 0; c < C; ++c) {
      even[c] = _mm512_fmadd_ps(p0, LoadRow16<F>(v0, c), even[c]);
      odd[c] = _mm512_fmadd_ps(p1, LoadRow16<F>(v1, c), odd[c]);
    }
  }
  if (r < rows) {
    const typename F::Row v0 = row(r);
    const __m512 p0 = _mm512_set1_ps(p[r] * F::RowScale(v0));
    for (int c = 0; c < C; ++c) even[c] = _mm512_fmadd_ps(p0, LoadRow16<F>(v0, c), even[c]);
  }
}

// The rows of one page of V as handles.
template <typename F>
struct PageRows {
  const PagedKvHead* kv;
  int32_t page;
  typename F::Row operator()(int32_t r) const { return F::PageRow(*kv, false, page, r); }
};
// Rows of fp32 in a buffer (bf16 or quantized rows widened once for several pairs).
struct BufferRows {
  const float* base;
  int32_t stride;
  const float* operator()(int32_t r) const { return base + int64_t(r) * stride; }
};

// out[16 * C] = sum over slots s < n of p[s] * V row s (AccumulateRows, page by page). With
// kScores, the same walk over the pages also adds to each slot's H2O score the probability it
// received from all G heads of the group (probs: [G][n]): the score line of a page is then
// touched while that page's V rows stream in, instead of in a second pass over the pages after
// them.
template <typename F, int C, bool kScores>
__attribute__((target("avx512f,f16c"))) void WeightedSumOfV(const PagedKvHead& kv, const float* p,
                                                            int32_t n, float* out,
                                                            const float* probs, int32_t G) {
  __m512 even[C], odd[C];
  for (int c = 0; c < C; ++c) even[c] = odd[c] = _mm512_setzero_ps();
  const int32_t bs = kv.block_size;
  for (int32_t s0 = 0; s0 < n; s0 += bs) {
    PrefetchRows<F>(kv, false, s0 + kPrefetchSlots, bs, n);
    const int32_t page = kv.pages[s0 / bs];
    const int32_t rows = std::min(bs, n - s0);
    if constexpr (kScores) AddReceived(kv, page, s0, rows, probs, n, G);
    AccumulateRows<F, C>(PageRows<F>{&kv, page}, p + s0, rows, even, odd);
  }
  for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + c * 16, _mm512_add_ps(even[c], odd[c]));
}

// Adds to the G heads' accumulators (acc: [G][2][16 * C], the even- and odd-slot sums of
// WeightedSumOfV) the rows [s0, s0 + rows) of one page (row(r): its row r).
template <typename F, int C, typename RowOf>
__attribute__((target("avx512f,f16c"))) inline void AccumulatePage(RowOf row, int32_t s0,
                                                                   int32_t rows,
                                                                   const float* probs, int32_t n,
                                                                   int32_t G, float* acc) {
  for (int32_t g = 0; g < G; ++g) {
    const float* p = probs + int64_t(g) * n;
    float* ag = acc + int64_t(g) * 2 * 16 * C;
    __m512 even[C], odd[C];
    for (int c = 0; c < C; ++c) {
      even[c] = _mm512_load_ps(ag + c * 16);
      odd[c] = _mm512_load_ps(ag + (C + c) * 16);
    }
    AccumulateRows<F, C>(row, p + s0, rows, even, odd);
    for (int c = 0; c < C; ++c) {
      _mm512_store_ps(ag + c * 16, even[c]);
      _mm512_store_ps(ag + (C + c) * 16, odd[c]);
    }
  }
}

// A page's bf16 or quantized V rows serving several (query, head) pairs are widened to fp32 once,
// where the page has at most this many rows (16 KiB of fp32 at head_dim 128), not once per pair:
// 16 KiB in L1 as the page streams in, never a copy of the context. Exact for bf16 and for int8
// (times a power of two); int4's group scale is applied as the direct loads apply it, so a pair
// gets bit for bit what it gets reading the rows directly.
inline constexpr int32_t kMaxWidenedRows = 32;

// wide[16 * C] = one row as fp32, its int8 scale applied.
template <typename F, int C>
__attribute__((target("avx512f,f16c"), always_inline)) inline void WidenRow(typename F::Row row,
                                                                           float* wide) {
  const __m512 scale = _mm512_set1_ps(F::RowScale(row));
  for (int c = 0; c < C; ++c) {
    const __m512 x = LoadRow16<F>(row, c);
    _mm512_store_ps(wide + c * 16, F::kRowScale ? _mm512_mul_ps(x, scale) : x);
  }
}

// wide[r][16 * C] = rows [0, rows) of a V page, as fp32.
template <typename F, int C>
__attribute__((target("avx512f,f16c"))) inline void WidenRows(const PagedKvHead& kv,
                                                              int32_t page, int32_t rows,
                                                              float* wide) {
  for (int32_t r = 0; r < rows; ++r) {
    WidenRow<F, C>(F::PageRow(kv, false, page, r), wide + int64_t(r) * 16 * C);
  }
}

template <typename F, int C>
__attribute__((target("avx512f,f16c"))) void WeightedSumsOfV(const AttentionArgs& a,
                                                             const float* probs, int32_t n,
                                                             float* out, bool add_scores) {
  const PagedKvHead& kv = a.kv;
  const int32_t G = a.group, bs = kv.block_size;
  if (G > kMaxTilePairs || G == 1) {
    // One walk over the V pages per head; the scores are added during the last head's walk,
    // when all G rows of probs are final.
    for (int32_t g = 0; g < G; ++g) {
      const float* p = probs + int64_t(g) * n;
      float* og = out + int64_t(g) * kv.head_dim;
      if (add_scores && g == G - 1) {
        WeightedSumOfV<F, C, true>(kv, p, n, og, probs, G);
      } else {
        WeightedSumOfV<F, C, false>(kv, p, n, og, probs, G);
      }
    }
    return;
  }
  // One walk over the V pages for the whole group: each page's rows are read from memory once
  // and then serve every head from L1 (a walk per head would read a long context's V G times).
  // Each head's accumulators live in `acc` between pages and take the same FMAs in the same
  // order as WeightedSumOfV, so the result is bit for bit the same.
  alignas(64) float acc[kMaxTilePairs * 2 * 16 * C];
  std::fill(acc, acc + int64_t(G) * 2 * 16 * C, 0.0f);
  constexpr bool kWiden = !std::is_same_v<F, internal::FloatKv>;
  alignas(64) float wide[kWiden ? kMaxWidenedRows * 16 * C : 1];
  for (int32_t s0 = 0; s0 < n; s0 += bs) {
    PrefetchRows<F>(kv, false, s0 + kPrefetchSlots, bs, n);
    const int32_t page = kv.pages[s0 / bs];
    const int32_t rows = std::min(bs, n - s0);
    if (add_scores) AddReceived(kv, page, s0, rows, probs, n, G);
    if constexpr (kWiden) {
      if (rows <= kMaxWidenedRows) {
        WidenRows<F, C>(kv, page, rows, wide);
        AccumulatePage<internal::FloatKv, C>(BufferRows{wide, 16 * C}, s0, rows, probs, n, G,
                                             acc);
        continue;
      }
    }
    AccumulatePage<F, C>(PageRows<F>{&kv, page}, s0, rows, probs, n, G, acc);
  }
  for (int32_t g = 0; g < G; ++g) {
    const float* ag = acc + int64_t(g) * 2 * 16 * C;
    float* og = out + int64_t(g) * kv.head_dim;
    for (int c = 0; c < C; ++c) {
      const __m512 sum = _mm512_add_ps(_mm512_load_ps(ag + c * 16),
                                       _mm512_load_ps(ag + (C + c) * 16));
      _mm512_storeu_ps(og + c * 16, sum);
    }
  }
}

// Queries [q0, q0 + nq) of the step (nq * group <= kMaxTilePairs, or nq = 1), attended in one
// walk over the pages: each 16-slot block of K rows and each page of V rows is read from memory
// once for the whole tile and then serves every (query, head) pair from L1, where attending the
// queries one by one reads a prefill chunk's context once per query. Each pair's arithmetic is
// what it gets alone, in the same order (PagedAttentionTileTest checks bit equality). scratch:
// query i's probabilities [G][n_i] one after another, n_i = num_old + q0 + i + 1.
template <typename F, int C>
__attribute__((target("avx512f,f16c"))) void AttendTileAvx512(const AttentionArgs& a, int32_t q0,
                                                               int32_t nq, float* scratch) {
  const PagedKvHead& kv = a.kv;
  constexpr int32_t hd = 16 * C;
  const int32_t G = a.group, bs = kv.block_size;
  const int32_t n_end = a.num_old + q0 + nq;  // slots the tile's last query sees
  const __m512 scale = _mm512_set1_ps(1.0f / std::sqrt(static_cast<float>(hd)));
  float* probs[kMaxTilePairs] = {};
  int32_t n[kMaxTilePairs] = {};
  for (int32_t i = 0; i < nq; ++i) {
    n[i] = a.num_old + q0 + i + 1;
    probs[i] = i == 0 ? scratch : probs[i - 1] + int64_t(G) * n[i - 1];
  }
  // Logits, 16 slots at a time (a block of 16 may span pages when block_size < 16).
  // bf16 and quantized rows serving several pairs are widened once into `wide`, not once per
  // pair (kMaxWidenedRows says why the result is the same).
  constexpr bool kWiden = !std::is_same_v<F, internal::FloatKv>;
  // int8 rows on a CPU with AVX512-VNNI: integer q.k (LogitsVnni16), no widening of K.
  constexpr bool kInt8 = std::is_same_v<F, internal::Int8Kv>;
  static const bool has_vnni = internal::HasAvx512Vnni();
  const bool vnni = kInt8 && C % 4 == 0 && has_vnni;
  const bool widen = kWiden && nq * G > 1 && !vnni;
  alignas(64) float wide[kWiden ? 16 * hd : 1];
  // A query per pair, rounded once for the whole walk; a group over kMaxTilePairs heads (nq is 1
  // then) rounds its first kMaxTilePairs and reads the rest's keys as Logits16 does.
  QuantizedQuery qq[kInt8 ? kMaxTilePairs : 1];
  if constexpr (kInt8 && C % 4 == 0) {
    if (vnni) {
      for (int32_t i = 0; i < nq; ++i) {
        for (int32_t g = 0; g < G && i * G + g < kMaxTilePairs; ++g) {
          QuantizeQuery(a.q + (q0 + i) * a.q_stride + int64_t(g) * hd, hd, &qq[i * G + g]);
        }
      }
    }
  }
  for (int32_t s0 = 0; s0 < n_end; s0 += 16) {
    PrefetchRows<F>(kv, true, s0 + kPrefetchSlots, 16, n_end);
    const int32_t last = std::min(16, n_end - s0) - 1;
    typename F::Row k[16];
    for (int32_t r = 0; r < 16; ++r) k[r] = F::At(kv, true, s0 + std::min(r, last));
    const float* kw[16];
    if constexpr (kWiden) {
      if (widen) {
        for (int32_t r = 0; r <= last; ++r) WidenRow<F, C>(k[r], wide + r * hd);
        for (int32_t r = 0; r < 16; ++r) kw[r] = wide + std::min(r, last) * hd;
      }
    }
    for (int32_t i = 0; i < nq; ++i) {
      if (n[i] <= s0) continue;
      const float* q = a.q + (q0 + i) * a.q_stride;
      for (int32_t g = 0; g < G; ++g) {
        float* out = probs[i] + int64_t(g) * n[i] + s0;
        if constexpr (kInt8 && C % 4 == 0) {
          if (vnni && i * G + g < kMaxTilePairs) {
            LogitsVnni16<C>(qq[i * G + g], k, n[i] - s0, scale, out);
            continue;
          }
        }
        if (widen) {
          Logits16<internal::FloatKv, C>(q + int64_t(g) * hd, kw, n[i] - s0, scale, out);
        } else {
          Logits16<F, C>(q + int64_t(g) * hd, k, n[i] - s0, scale, out);
        }
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
  // out = sum_s p[s] * v_s for every pair, and the H2O scores.
  if (nq == 1) {
    WeightedSumsOfV<F, C>(a, probs[0], n[0], a.out + q0 * a.out_stride,
                          internal::FusesScoreAdd(a, q0));
    return;
  }
  alignas(64) float acc[kMaxTilePairs * 2 * hd];
  std::fill(acc, acc + int64_t(nq) * G * 2 * hd, 0.0f);
  alignas(64) float vwide[kWiden ? kMaxWidenedRows * hd : 1];
  for (int32_t s0 = 0; s0 < n_end; s0 += bs) {
    PrefetchRows<F>(kv, false, s0 + kPrefetchSlots, bs, n_end);
    const int32_t page = kv.pages[s0 / bs];
    const int32_t page_rows = std::min(bs, n_end - s0);
    bool widened = false;
    if constexpr (kWiden) {
      widened = page_rows <= kMaxWidenedRows;
      if (widened) WidenRows<F, C>(kv, page, page_rows, vwide);
    }
    for (int32_t i = 0; i < nq; ++i) {
      const int32_t rows = std::min(bs, n[i] - s0);
      if (rows <= 0) continue;
      if (internal::FusesScoreAdd(a, q0 + i)) AddReceived(kv, page, s0, rows, probs[i], n[i], G);
      float* acc_i = acc + int64_t(i) * G * 2 * hd;
      if (widened) {
        AccumulatePage<internal::FloatKv, C>(BufferRows{vwide, hd}, s0, rows, probs[i], n[i], G,
                                             acc_i);
      } else {
        AccumulatePage<F, C>(PageRows<F>{&kv, page}, s0, rows, probs[i], n[i], G, acc_i);
      }
    }
  }
  for (int32_t i = 0; i < nq; ++i) {
    for (int32_t g = 0; g < G; ++g) {
      const float* ag = acc + (int64_t(i) * G + g) * 2 * hd;
      float* og = a.out + (q0 + i) * a.out_stride + int64_t(g) * hd;
      for (int c = 0; c < C; ++c) {
        _mm512_storeu_ps(og + c * 16, _mm512_add_ps(_mm512_load_ps(ag + c * 16),
                                                    _mm512_load_ps(ag + (C + c) * 16)));
      }
    }
  }
}

template <typename F>
void AttendTileAvx512(const AttentionArgs& a, int32_t q0, int32_t nq, float* scratch) {
  switch (a.kv.head_dim / 16) {
    case 1: AttendTileAvx512<F, 1>(a, q0, nq, scratch); break;
    case 2: AttendTileAvx512<F, 2>(a, q0, nq, scratch); break;
    case 3: AttendTileAvx512<F, 3>(a, q0, nq, scratch); break;
    case 4: AttendTileAvx512<F, 4>(a, q0, nq, scratch); break;
    case 5: AttendTileAvx512<F, 5>(a, q0, nq, scratch); break;
    case 6: AttendTileAvx512<F, 6>(a, q0, nq, scratch); break;
    case 7: AttendTileAvx512<F, 7>(a, q0, nq, scratch); break;
    case 8: AttendTileAvx512<F, 8>(a, q0, nq, scratch); break;
  }
}

// After query qi's probabilities are final (probs: [G][n], n = num_old + qi + 1), folds what each
// slot received into its channel, for the kinds the p.v pass does not fuse.
// Folds what each of kv's first n slots received (probs: [G][n], final) into its channel:
// `add` adds it (kAccumulated, kObservationWindow), else as `kind` says (kLast, kAboveMeanCount,
// against `mean`, the mean of what a slot receives).
void FoldReceived(const PagedKvHead& kv, int32_t n, int32_t G, const float* probs,
                  const ChannelSpec& channel, bool add, float mean) {
  const SlotChannel kind = channel.kind;
  const int32_t bs = kv.block_size;
  for (int32_t s0 = 0; s0 < n; s0 += bs) {
    float* ch = kv.score + kv.pages[s0 / bs] * kv.meta_page_stride;
    const int32_t rows = std::min(bs, n - s0);
    for (int32_t r = 0; r < rows; ++r) {
      float received = probs[s0 + r];
      for (int32_t g = 1; g < G; ++g) received += probs[int64_t(g) * n + s0 + r];
      if (add) {
        ch[r] += received;
      } else {
        ch[r] = kind == SlotChannel::kLast ? received
                                           : ch[r] * channel.decay + (received > mean ? 1.0f : 0.0f);
      }
    }
  }
}

void UpdateChannel(const AttentionArgs& a, int32_t qi, const float* probs) {
  const SlotChannel kind = a.channel.kind;
  if (kind != SlotChannel::kLast && kind != SlotChannel::kAboveMeanCount) return;
  const int32_t n = a.num_old + qi + 1;
  // Each head's probabilities sum to 1, so the mean of what a slot receives is G / n.
  FoldReceived(a.kv, n, a.group, probs, a.channel, false,
               static_cast<float>(a.group) / static_cast<float>(n));
}

void AttendInStoredBasis(Isa isa, const AttentionArgs& args, float* scratch);

}  // namespace

void PagedAttentionWith(Isa isa, const AttentionArgs& args, float* scratch) {
  if (!args.kv.rotated()) {
    AttendInStoredBasis(isa, args, scratch);
    return;
  }
  // Rows stored rotated (PagedKvHead::rotated): attend with H q, whose dot products with the
  // stored H k are q . k, then rotate the output, sum_s p_s H v_s = H sum_s p_s v_s, back.
  const int32_t hd = args.kv.head_dim, G = args.group;
  thread_local std::vector<float> q;
  q.resize(size_t(args.num_q) * G * hd);
  for (int32_t i = 0; i < args.num_q; ++i) {
    for (int32_t g = 0; g < G; ++g) {
      float* row = q.data() + (int64_t(i) * G + g) * hd;
      std::memcpy(row, args.q + i * args.q_stride + int64_t(g) * hd, sizeof(float) * hd);
      HadamardRotate(row, hd);
    }
  }
  AttentionArgs a = args;
  a.q = q.data();
  a.q_stride = int64_t(G) * hd;
  AttendInStoredBasis(isa, a, scratch);
  for (int32_t i = 0; i < args.num_q; ++i) {
    for (int32_t g = 0; g < G; ++g) {
      HadamardRotate(args.out + i * args.out_stride + int64_t(g) * hd, hd);
    }
  }
}

namespace {

void AttendInStoredBasis(Isa isa, const AttentionArgs& args, float* scratch) {
  // A path that cannot take this head_dim hands over to the next narrower one.
  // int4 rows take the SIMD paths when their groups are 32 elements.
  const bool int4_odd = args.kv.quant == KvQuant::kInt4 && args.kv.head_dim % 32 != 0;
  const bool avx512 = isa == Isa::kAvx512 && args.kv.head_dim % 16 == 0 &&
                      args.kv.head_dim <= 128 && !int4_odd;
  const bool avx2 = !avx512 && (isa == Isa::kAvx512 || isa == Isa::kAvx2) &&
                    internal::Avx2Handles(args) && !int4_odd;
  if (avx512 || avx2) {  // a tile of queries at a time
    const int32_t tile = AttentionTileQueries(args.group);
    for (int32_t q0 = 0; q0 < args.num_q; q0 += tile) {
      const int32_t nq = std::min(tile, args.num_q - q0);
      if (avx2) {
        internal::AttendTileAvx2(args, q0, nq, scratch);
      } else if (args.kv.quantized()) {
        if (args.kv.quant == KvQuant::kInt8) {
          AttendTileAvx512<internal::Int8Kv>(args, q0, nq, scratch);
        } else {
          AttendTileAvx512<internal::Int4Kv>(args, q0, nq, scratch);
        }
      } else if (args.kv.bf16()) {
        AttendTileAvx512<internal::Bf16Kv>(args, q0, nq, scratch);
      } else {
        AttendTileAvx512<internal::FloatKv>(args, q0, nq, scratch);
      }
      const float* probs = scratch;
      for (int32_t i = 0; i < nq; ++i) {
        UpdateChannel(args, q0 + i, probs);
        probs += int64_t(args.group) * (args.num_old + q0 + i + 1);
      }
    }
    return;
  }
  // A query at a time, its probabilities where a tile's would be (the layout every path leaves:
  // PagedAttentionWithDemoted reads it).
  const int32_t tile = AttentionTileQueries(args.group);
  int64_t offset = 0;
  for (int32_t qi = 0; qi < args.num_q; ++qi) {
    if (qi % tile == 0) offset = 0;
    float* probs = scratch + offset;
    if (args.kv.quantized()) {
      AttendOneQueryQuant(args, qi, probs);
    } else if (args.kv.bf16()) {
      AttendOneQueryBf16(args, qi, probs);
    } else {
      AttendOneQuery(args, qi, probs);
    }
    UpdateChannel(args, qi, probs);
    offset += int64_t(args.group) * (args.num_old + qi + 1);
  }
}

}  // namespace

void PagedAttention(const AttentionArgs& args, float* scratch) {
  PagedAttentionWith(BestIsa(), args, scratch);
}

void PagedAttentionWithDemoted(const AttentionArgs& args, const PagedKvHead& demoted,
                               float* scratch, Isa isa) {
  const int32_t nd = demoted.num_slots;
  if (nd == 0) {
    PagedAttentionWith(isa, args, scratch);
    return;
  }
  const int32_t G = args.group, hd = args.kv.head_dim;
  const int32_t tile = AttentionTileQueries(G);
  // Per tile of queries: the cache part (one walk for the tile, as PagedAttention's tiles) and
  // the demoted part (every query of the tile sees the whole store: its nq x G rows attend as
  // one group of one query), each unnormalised with its statistics, then combined per query.
  thread_local std::vector<float> q, dprobs, out, stats;
  q.resize(int64_t(tile) * G * hd);
  dprobs.resize(int64_t(tile) * G * nd);
  out.resize(2 * int64_t(tile) * G * hd);
  stats.resize(4 * int64_t(tile) * G);
  for (int32_t q0 = 0; q0 < args.num_q; q0 += tile) {
    const int32_t nq = std::min(tile, args.num_q - q0);
    AttentionArgs m = args;  // slots [0, num_old + q0 + i] for query i of the tile
    m.kv.num_slots = args.num_old + q0 + nq;
    m.num_old = args.num_old + q0;
    m.num_q = nq;
    m.q = args.q + q0 * args.q_stride;
    m.out = out.data();
    m.out_stride = int64_t(G) * hd;
    m.part_stats = stats.data();
    m.channel = ChannelSpec{};
    for (int32_t i = 0; i < nq; ++i) {
      std::memcpy(q.data() + int64_t(i) * G * hd, m.q + i * args.q_stride,
                  sizeof(float) * G * hd);
    }
    AttentionArgs d = m;
    d.kv = demoted;
    d.num_old = nd - 1;
    d.num_q = 1;
    d.group = nq * G;
    d.q = q.data();
    d.q_stride = 0;
    d.out = out.data() + int64_t(tile) * G * hd;
    d.out_stride = 0;
    d.part_stats = stats.data() + 2 * int64_t(tile) * G;
    PagedAttentionWith(isa, m, scratch);
    PagedAttentionWith(isa, d, dprobs.data());
    float* probs = scratch;  // query i's [G][n_i], one after another
    for (int32_t i = 0; i < nq; ++i) {
      const int32_t qi = q0 + i, n = args.num_old + qi + 1;
      float* dp = dprobs.data() + int64_t(i) * G * nd;
      for (int32_t g = 0; g < G; ++g) {  // as CombineAttentionParts, for two parts
        const int64_t r = int64_t(i) * G + g;
        const float m0 = stats[2 * r], m1 = stats[2 * (int64_t(tile) * G + r)];
        const float mx = std::max(m0, m1);
        const float e0 = std::exp(m0 - mx), e1 = std::exp(m1 - mx);
        const float z = e0 * stats[2 * r + 1] + e1 * stats[2 * (int64_t(tile) * G + r) + 1];
        const float w0 = e0 / z, w1 = e1 / z;
        const float* o0 = out.data() + r * hd;
        const float* o1 = out.data() + (int64_t(tile) * G + r) * hd;
        float* o = args.out + qi * args.out_stride + int64_t(g) * hd;
        for (int32_t c = 0; c < hd; ++c) o[c] = w0 * o0[c] + w1 * o1[c];
        for (int32_t s = 0; s < n; ++s) probs[int64_t(g) * n + s] *= w0;
        for (int32_t s = 0; s < nd; ++s) dp[int64_t(g) * nd + s] *= w1;
      }
      const SlotChannel kind = args.channel.kind;
      const bool add = internal::FusesScoreAdd(args, qi);
      if (add || kind == SlotChannel::kLast || kind == SlotChannel::kAboveMeanCount) {
        const float mean = static_cast<float>(G) / static_cast<float>(n + nd);
        FoldReceived(args.kv, n, G, probs, args.channel, add, mean);
        FoldReceived(demoted, nd, G, dp, args.channel, add, mean);
      }
      probs += int64_t(G) * n;
    }
  }
}

AttentionArgs PartArgs(const AttentionArgs& a, const int32_t* bounds, int32_t j, float* part_out,
                       float* part_stats) {
  AttentionArgs p = a;
  p.kv.pages += bounds[j] / a.kv.block_size;  // the slots [bounds[j], bounds[j + 1])
  p.kv.num_slots = bounds[j + 1] - bounds[j];
  p.num_old = p.kv.num_slots - 1;  // the one query sees the whole part
  p.num_q = 1;
  p.out = part_out + int64_t(j) * a.group * a.kv.head_dim;
  p.part_stats = part_stats + int64_t(j) * a.group * 2;
  p.channel = ChannelSpec{};
  return p;
}

void CombineAttentionParts(const AttentionArgs& a, const int32_t* bounds, int32_t parts,
                           const float* part_out, const float* part_stats,
                           const float* const* part_probs, float* probs) {
  const int32_t G = a.group, hd = a.kv.head_dim, n = bounds[parts];
  for (int32_t g = 0; g < G; ++g) {
    // softmax over the whole context = each part's e_s (relative to its own max m_j) times
    // exp(m_j - m) / Z, with m the largest m_j and Z = sum_j exp(m_j - m) * sum_j.
    float m = -INFINITY;
    for (int32_t j = 0; j < parts; ++j) m = std::max(m, part_stats[(int64_t(j) * G + g) * 2]);
    float z = 0.0f;
    for (int32_t j = 0; j < parts; ++j) {
      const float* st = part_stats + (int64_t(j) * G + g) * 2;
      z += std::exp(st[0] - m) * st[1];
    }
    float* out = a.out + int64_t(g) * hd;
    std::fill(out, out + hd, 0.0f);
    for (int32_t j = 0; j < parts; ++j) {
      const float w = std::exp(part_stats[(int64_t(j) * G + g) * 2] - m) / z;
      const float* o = part_out + (int64_t(j) * G + g) * hd;
      for (int32_t d = 0; d < hd; ++d) out[d] += w * o[d];
      const int32_t len = bounds[j + 1] - bounds[j];
      const float* e = part_probs[j] + int64_t(g) * len;
      float* p = probs + int64_t(g) * n + bounds[j];
      for (int32_t s = 0; s < len; ++s) p[s] = w * e[s];
    }
  }
  // What each slot received, as the unsplit kernel writes it (its one query is query 0).
  if (internal::FusesScoreAdd(a, 0)) {
    for (int32_t s0 = 0; s0 < n; s0 += a.kv.block_size) {
      float* score = a.kv.score + a.kv.pages[s0 / a.kv.block_size] * a.kv.meta_page_stride;
      const int32_t rows = std::min(a.kv.block_size, n - s0);
      for (int32_t r = 0; r < rows; ++r) {
        float received = 0.0f;
        for (int32_t g = 0; g < G; ++g) received += probs[int64_t(g) * n + s0 + r];
        score[r] += received;
      }
    }
  }
  UpdateChannel(a, 0, probs);
}

}  // namespace heavykv::cpu
