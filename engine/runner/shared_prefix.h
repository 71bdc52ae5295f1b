// Shared-prefix attention: decode steps of full-cache sequences whose block tables begin with
// the same pages (the n choices of one request, which KvCache::Fork gives the prompt's pages; or
// prompts the prefix cache lends several sequences) attend those pages in one walk for all of
// them, then each its own slots, and the two parts are combined per (query, head) as split-K's
// parts are (cpu::CombineAttentionParts). The shared walk is one PagedAttention call whose group
// is every member's query heads of the kv head (members x G), so each shared K row and V page is
// read once per walk instead of once per member: the pages that n choices hold once are also
// read about once a step. The arithmetic is split-K's: each member's output equals its unsplit
// attention to float rounding.
//
// Who: ModelRunner::Forward, per layer, in three phases separated by barriers: every task's
// K/V rows appended (prepare), then the items of Items() (the shared walks, the members' own
// parts, the other tasks' whole attention), then Combine for the members.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/runner/step_runner.h"
#include "kernels/cpu/paged_attention.h"
#include "memory/kv_cache.h"

namespace heavykv {

class SharedPrefixAttention {
 public:
  // Fewest pages a group must share at a layer for the walk to be worth its combine.
  static constexpr int32_t kMinSharedPages = 2;

  // Plans a step (before its K/V rows are appended): groups of two or more of its decode steps
  // (one token, no policy, the pool's own rows, no demoted store) whose tables begin with the
  // same page, and per layer the pages they all share. False when there is no group.
  bool Plan(std::span<const SequenceStep> steps, const KvCache& cache, int32_t num_layers,
            int32_t num_kv_heads, int32_t group_size, int32_t head_dim);

  // One unit of a layer's attention: a shared walk (group >= 0, over kv head `head`), or a
  // task's (step * num_kv_heads + kv head) own part when it is a member at this layer, else its
  // whole attention (group < 0).
  struct Item {
    int32_t group = -1;
    int32_t head = 0;
    int64_t task = -1;
  };
  const std::vector<Item>& Items(int32_t layer) const { return items_[size_t(layer)]; }
  // Whether `task` attends in two parts at `layer` (Combine then writes its output).
  bool Member(int32_t layer, int64_t task) const;

  // The shared walk of group `g` over kv head `h` at `layer`: gathers the members' query heads
  // from the rows of `qkv` (row stride qkv_stride; a task's queries start at its step's first
  // row, `first_token`, and its kv head's first query head) and attends the shared pages.
  void AttendShared(int32_t layer, int32_t g, int32_t h, const float* qkv, int64_t qkv_stride,
                    std::span<const int64_t> first_token, KvCache& cache,
                    std::span<const SequenceStep> steps);
  // A member's own part: slots from the shared pages' end to its newest (a, its whole-context
  // arguments, as prepare made them).
  void AttendOwn(int32_t layer, int64_t task, const cpu::AttentionArgs& a);
  // A member's output (a.out) from its two parts.
  void Combine(int32_t layer, int64_t task, const cpu::AttentionArgs& a);

  // Shared walks run since construction (for tests and benchmarks).
  int64_t walks() const { return walks_; }

 private:
  struct Group {
    std::vector<int32_t> steps;         // members, in step order
    std::vector<int32_t> shared_pages;  // per layer (0: not shared at that layer)
    int64_t buf = 0;                    // its first row in the walk buffers, per kv head
  };
  int32_t SharedSlots(int32_t layer, int32_t g) const {
    return groups_[size_t(g)].shared_pages[size_t(layer)] * block_size_;
  }

  int32_t n_kv_ = 0, G_ = 0, hd_ = 0, block_size_ = 0;
  std::vector<Group> groups_;
  std::vector<int32_t> group_of_;  // per step: its group, or -1
  std::vector<int32_t> member_at_;  // per step: its place among its group's members
  std::vector<std::vector<Item>> items_;  // per layer
  int64_t max_slots_ = 0;  // the most slots any member holds this step (its new one included)
  // Walk buffers: per (group, kv head) the members' gathered queries and the walk's output
  // [members x G][head_dim], statistics [members x G][2] and probabilities [members x G][slots].
  std::vector<float> q_, out_, stats_, probs_;
  // Per task: its two parts' outputs [2][G][head_dim] and statistics [2][G][2], and its own
  // part's probabilities [G][max_slots_].
  std::vector<float> part_out_, part_stats_, own_probs_;
  int64_t walks_ = 0;
};

}  // namespace heavykv
