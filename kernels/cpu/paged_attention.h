// Paged attention on the CPU: one (sequence, kv head) and the query heads of its GQA group,
// reading K/V through the sequence's block table. It also writes what eviction policies observe:
// the attention probability every slot received, summed over the group's query heads, folded
// into the slot's channel as `channel` says (kernels/slot_channel.h).
#pragma once

#include <cstdint>

#include "kernels/cpu/isa.h"
#include "kernels/paged_kv.h"
#include "kernels/slot_channel.h"

namespace heavykv::cpu {

struct AttentionArgs {
  // K/V of the kv head. Slots [0, num_old) are cached tokens, slots [num_old, num_old + num_q)
  // hold this step's new tokens in order; query i sees slots [0, num_old + i] (causal).
  PagedKvHead kv;
  int32_t num_old = 0;
  int32_t num_q = 1;
  int32_t group = 1;  // query heads served by this kv head
  // Query i, head g of the group: q + i * q_stride + g * head_dim  [head_dim]
  const float* q = nullptr;
  int64_t q_stride = 0;
  // Output row with the same layout as q.
  float* out = nullptr;
  int64_t out_stride = 0;
  // What to write in kv.Score(s) (an attention kind of SlotChannel, or kNone). kAccumulated
  // (and kObservationWindow within its window) is fused into the p.v pass; the others are one
  // pass over the probabilities per query.
  ChannelSpec channel;
};

// (query, head) pairs the AVX-512 path attends in one walk over the pages: a tile of a prefill
// chunk's queries reads each K and V page from memory once for all its pairs.
inline constexpr int32_t kMaxTilePairs = 16;
// Queries of one tile for a group of `group` heads (1 for a group over kMaxTilePairs).
inline int32_t AttentionTileQueries(int32_t group) {
  return group >= kMaxTilePairs ? 1 : kMaxTilePairs / group;
}

// Scratch floats PagedAttention needs for a head with `num_slots` slots (this step's included),
// `group` heads and `num_q` queries: one tile's probabilities, O(tile x context).
inline int64_t AttentionScratchFloats(int32_t num_slots, int32_t group, int32_t num_q) {
  const int32_t tile = num_q < AttentionTileQueries(group) ? num_q : AttentionTileQueries(group);
  return int64_t(tile > 0 ? tile : 1) * num_slots * group;
}

// Runs attention for one (sequence, kv head). `scratch` has AttentionScratchFloats() floats.
// Runs the path of BestIsa() that takes this head_dim: AVX-512 (head_dim a multiple of 16 up to
// 128), AVX2 + FMA (paged_attention_avx2.cc; a multiple of 8), else the portable loops.
void PagedAttention(const AttentionArgs& args, float* scratch);
// The same starting from `isa`'s path (which the CPU must support), for tests, which run every
// path the machine has, and benchmarks.
void PagedAttentionWith(Isa isa, const AttentionArgs& args, float* scratch);

}  // namespace heavykv::cpu
