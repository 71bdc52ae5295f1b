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
  // One part of a split context (CombineAttentionParts, PagedAttentionWithDemoted): when set,
  // the softmax is left unnormalised, e_s = exp(l_s - m), in the scratch (as the probabilities
  // are); out gets sum_s e_s v_s per (query, head); part_stats[(i * group + g) * 2] and [.. + 1]
  // get query i, head g's m and sum_s e_s. The channel must be kNone (the combine writes it).
  float* part_stats = nullptr;
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

// Split-K decode: one (sequence, kv head)'s single query over a long context, cut into parts
// that different threads attend at once (when a step has fewer (sequence, kv head) pairs than
// cores). The parts end at `bounds` (bounds[0] = 0 < ... < bounds[parts] = num_slots, every
// bound a multiple of the block size); PartArgs(a, j) is what part j runs through
// PagedAttention, with its own scratch and part_out/part_stats rows; CombineAttentionParts
// rescales the parts' sums to the whole context's softmax (as flash-decoding and the CUDA split
// kernel do), writes a.out and the channel a.channel asks for, as the unsplit call would (to
// float rounding). part_out: [parts][group][head_dim]; part_stats: [parts][group][2];
// part_probs[j]: part j's scratch; probs: AttentionScratchFloats(num_slots, group, 1) floats.
AttentionArgs PartArgs(const AttentionArgs& a, const int32_t* bounds, int32_t j, float* part_out,
                       float* part_stats);
void CombineAttentionParts(const AttentionArgs& a, const int32_t* bounds, int32_t parts,
                           const float* part_out, const float* part_stats,
                           const float* const* part_probs, float* probs);

// MiKV: attention over a head's cache and its demoted store (`demoted`: quantized rows of the
// tokens its policy evicted, all older than the step's queries, which every query sees) as one
// softmax. A tile of queries attends the two as the two parts of a split context (part_stats:
// unnormalised sums and statistics, combined per query as CombineAttentionParts does): the
// cache in one walk for the tile, the store as one group of the tile's query heads; what each
// slot received goes into its own store's channel as args.channel says, with the mean over both
// stores for kAboveMeanCount. With no demoted slots, PagedAttention. scratch: AttentionScratchFloats(args.kv.num_slots, group, num_q) floats.
// Runs `isa`'s paths (the CPU must support it).
void PagedAttentionWithDemoted(const AttentionArgs& args, const PagedKvHead& demoted,
                               float* scratch, Isa isa = BestIsa());

// Runs attention for one (sequence, kv head). `scratch` has AttentionScratchFloats() floats; on
// return it holds the last tile's probabilities (queries [q0, num_q), q0 the last multiple of
// AttentionTileQueries(group)): query q0 + i's [group][num_old + q0 + i + 1] one after another,
// on every path.
// Runs the path of BestIsa() that takes this head_dim: AVX-512 (head_dim a multiple of 16 up to
// 128), AVX2 + FMA (paged_attention_avx2.cc; a multiple of 8), else the portable loops.
void PagedAttention(const AttentionArgs& args, float* scratch);
// The same starting from `isa`'s path (which the CPU must support), for tests, which run every
// path the machine has, and benchmarks.
void PagedAttentionWith(Isa isa, const AttentionArgs& args, float* scratch);

}  // namespace heavykv::cpu
