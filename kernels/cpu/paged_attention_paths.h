// Internal to paged_attention.cc: the attention paths compiled in their own source files. Not for
// other callers: use PagedAttention / PagedAttentionWith (paged_attention.h).
#pragma once

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
