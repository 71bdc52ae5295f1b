// Internal to paged_attention.cc: the attention paths compiled in their own source files. Not for
// other callers: use PagedAttention / PagedAttentionWith (paged_attention.h).
#pragma once

#include <algorithm>
#include <type_traits>

#include "kernels/cpu/paged_attention.h"

namespace heavykv::cpu::internal {

// The storages of K/V rows, as the SIMD paths see them: a handle to the K or V row of a slot (or
// of row r of a page), and the factor each row's sum is scaled by. Float rows: the element
// pointer. Quantized rows (kernels/kv_quant.h): data and scale pointers; int8's power-of-two
// scale is the row's (applied to the finished q.k, or to the probability that weighs the V row),
// int4's per-group scales are applied to each converted chunk by the loads.
// T: float (fp32 rows at kv.k / kv.v) or uint16_t (bf16 rows at kv.k16 / kv.v16).
template <typename T>
struct PlainKv {
  using Row = const T*;
  static constexpr bool kRowScale = false;
  static const T* Base(const PagedKvHead& kv, bool is_k) {
    if constexpr (std::is_same_v<T, float>) {
      return is_k ? kv.k : kv.v;
    } else {
      return is_k ? kv.k16 : kv.v16;
    }
  }
  static Row At(const PagedKvHead& kv, bool is_k, int32_t s) {
    return Base(kv, is_k) + kv.RowOffset(s);
  }
  static Row PageRow(const PagedKvHead& kv, bool is_k, int32_t page, int32_t r) {
    return Base(kv, is_k) + page * kv.page_stride + int64_t(r) * kv.head_dim;
  }
  static float RowScale(Row) { return 1.0f; }
  static const void* Data(Row row) { return row; }
  static int64_t RowBytes(const PagedKvHead& kv) { return int64_t(kv.head_dim) * sizeof(T); }
};
using FloatKv = PlainKv<float>;
using Bf16Kv = PlainKv<uint16_t>;
struct QuantRow {
  const uint8_t* data;
  const uint8_t* scale;
};
template <KvQuant kQuant>
struct QuantKv {
  using Row = QuantRow;
  static constexpr bool kRowScale = kQuant == KvQuant::kInt8;
  static Row At(const PagedKvHead& kv, bool is_k, int32_t s) {
    return {(is_k ? kv.kq : kv.vq) + kv.QRowOffset(s),
            (is_k ? kv.ksc : kv.vsc) + kv.QScaleOffset(s)};
  }
  static Row PageRow(const PagedKvHead& kv, bool is_k, int32_t page, int32_t r) {
    const int64_t base = page * kv.page_stride;
    return {(is_k ? kv.kq : kv.vq) + base + int64_t(r) * kv.row_bytes,
            (is_k ? kv.ksc : kv.vsc) + base + int64_t(r) * kv.scale_bytes};
  }
  static float RowScale(Row row) { return kRowScale ? E8m0ToFloat(*row.scale) : 1.0f; }
  static const void* Data(Row row) { return row.data; }
  static int64_t RowBytes(const PagedKvHead& kv) { return kv.row_bytes; }
  static const void* Scales(Row row) { return row.scale; }
  static int64_t ScaleBytes(const PagedKvHead& kv) { return kv.scale_bytes; }
};
using Int8Kv = QuantKv<KvQuant::kInt8>;
using Int4Kv = QuantKv<KvQuant::kInt4>;

// Starts loading the rows of slots [s, s + count) of a K or V walk that are on the page holding
// s, when s < n: issued two blocks ahead of the one being computed, so that the next page's rows
// are on their way while this one's are used (pages are scattered, and a hardware prefetcher
// stops at each). Measured (docs/BENCHMARKS.md "Long contexts, session 11"): AVX-512 1.3x at
// group 1 (attention/ctx512/avx512) and no change at GQA 4, whose arithmetic per byte keeps the
// walk slow; AVX2 1.1-1.25x at GQA 4 and no change at group 1. Both paths use it. Quantized
// rows' scales too: they sit apart from the rows, a line or two per page, and left alone they
// are one latency-bound miss per page (int8 at GQA 4, 16k context, on this noisy VM: 1.29-1.36x
// bf16's tokens/s without, 1.37-1.50x with).
template <typename F>
__attribute__((always_inline)) inline void PrefetchRows(const PagedKvHead& kv, bool is_k,
                                                        int32_t s, int32_t count, int32_t n) {
  if (s >= n) return;
  const int32_t rows = std::min({count, kv.block_size - s % kv.block_size, n - s});
  const typename F::Row first = F::At(kv, is_k, s);
  const char* p = static_cast<const char*>(F::Data(first));
  const int64_t bytes = int64_t(rows) * F::RowBytes(kv);
  for (int64_t b = 0; b < bytes; b += 64) PrefetchLine(p + b);
  if constexpr (std::is_same_v<typename F::Row, QuantRow>) {
    const char* sc = static_cast<const char*>(F::Scales(first));
    const int64_t scale_bytes = int64_t(rows) * F::ScaleBytes(kv);
    for (int64_t b = 0; b < scale_bytes; b += 64) PrefetchLine(sc + b);
    PrefetchLine(sc + scale_bytes - 1);  // the last line, where the span crosses one
  }
}

// Slots this many ahead of the block being computed are prefetched (16 and 64: no different).
inline constexpr int32_t kPrefetchSlots = 32;

// Whether query qi adds what each slot received to its channel in the p.v pass: kAccumulated,
// and kObservationWindow for the step's last `window` queries.
inline bool FusesScoreAdd(const AttentionArgs& a, int32_t qi) {
  return a.channel.kind == SlotChannel::kAccumulated ||
         (a.channel.kind == SlotChannel::kObservationWindow && qi >= a.num_q - a.channel.window);
}

// AVX2 + FMA (paged_attention_avx2.cc): any head_dim that is a multiple of 8. Attends the tile
// of queries [q0, q0 + nq), nq <= AttentionTileQueries(group); scratch: the tile's
// probabilities, query after query ([group][num_old + q0 + i + 1] each).
bool Avx2Handles(const AttentionArgs& args);
void AttendTileAvx2(const AttentionArgs& args, int32_t q0, int32_t nq, float* scratch);

}  // namespace heavykv::cpu::internal
