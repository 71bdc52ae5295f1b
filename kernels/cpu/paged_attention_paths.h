// Internal to paged_attention.cc: the attention paths compiled in their own source files. Not for
// other callers: use PagedAttention / PagedAttentionWith (paged_attention.h).
#pragma once

#include <algorithm>
#include <type_traits>

#include "kernels/cpu/paged_attention.h"

namespace heavykv::cpu::internal {

// The K (or V) storage of a head as elements of T: float for fp32, uint16_t for bf16.
template <typename T>
inline const T* Base(const PagedKvHead& kv, bool is_k) {
  if constexpr (std::is_same_v<T, float>) {
    return is_k ? kv.k : kv.v;
  } else {
    return is_k ? kv.k16 : kv.v16;
  }
}

// Starts loading the rows of slots [s, s + count) of a K or V walk that are on the page holding
// s, when s < n: issued two blocks ahead of the one being computed, so that the next page's rows
// are on their way while this one's are used (pages are scattered, and a hardware prefetcher
// stops at each). Measured (docs/BENCHMARKS.md "Long contexts, session 11"): AVX-512 1.3x at
// group 1 (attention/ctx512/avx512) and no change at GQA 4, whose arithmetic per byte keeps the
// walk slow; AVX2 1.1-1.25x at GQA 4 and no change at group 1. Both paths use it.
template <typename T>
__attribute__((always_inline)) inline void PrefetchRows(const PagedKvHead& kv, const T* base,
                                                        int32_t s, int32_t count, int32_t n) {
  if (s >= n) return;
  const int32_t rows = std::min({count, kv.block_size - s % kv.block_size, n - s});
  const char* p = reinterpret_cast<const char*>(base + kv.RowOffset(s));
  const int64_t bytes = int64_t(rows) * kv.head_dim * sizeof(T);
  for (int64_t b = 0; b < bytes; b += 64) PrefetchLine(p + b);
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
