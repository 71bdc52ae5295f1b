// KvCache: the one shared pool of fixed-size KV pages and the per-sequence block tables on it.
//
// The pool is allocated once at start. A page holds `block_size` token slots for every layer and
// kv head: K and V rows, and per slot the position of the token held and its score: the one
// channel its policy observes (kernels/slot_channel.h; h2o: accumulated attention). All (layer, kv head) pairs of a sequence hold the same number of tokens, so one
// block table serves all heads, yet each head keeps its own tokens: when a head evicts, a newer
// token of that head moves into the victim's slot (per-slot position and score make that legal).
// Per-head eviction is thus O(1) data movement per evicted token and needs no per-head tables.
//
// Ownership: KvCache owns all KV storage and is the only code that allocates, frees or compacts
// it. Callers own their SequenceKv values (ids only, no pointers) and may only change them
// through KvCache methods. The runner writes new K/V rows through View(); kernels read K/V and
// write the score channel through it.
//
// External storage (KvStorage::kExternal, the CUDA backend): KvCache still owns the page ids,
// block tables and slot counts (Reserve / Commit / Truncate / Release work as above), but holds
// no K/V, pos or score arrays. They live in device memory owned by the runner
// (engine/cuda/cuda_model_runner.h), with the same page layout and shape.element_bytes per K/V
// element; that runner appends, attends and evicts there, then calls Commit. View() and
// EvictHead() are then unavailable (they abort).
//
// A step on a sequence: Reserve(n) -> kernels append n rows at slots [num_slots, num_slots+n) of
// every (layer, head) and attend -> EvictHead() on every (layer, head) -> Commit(). Between steps
// a sequence holds ceil(num_slots / block_size) <= ceil(budget / block_size) pages (one more at
// page granularity: KeptAfterStep).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/paged_kv.h"
#include "memory/aligned_vector.h"
#include "memory/eviction_policy.h"
#include "memory/page_allocator.h"

namespace heavykv {

struct KvShape {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 16;
  int32_t element_bytes = 4;  // per K/V element: 4 (fp32) or 2 (bf16: --kv-dtype, and on a GPU)

  // Bytes of one page: K+V rows plus position and score per slot, for every layer and kv head.
  int64_t PageBytes() const;
  int64_t PageFloats() const {
    return int64_t(num_layers) * num_kv_heads * 2 * block_size * head_dim;
  }
  int64_t PageMetaEntries() const { return int64_t(num_layers) * num_kv_heads * block_size; }
};

// One sequence's cache state. Mutated only by KvCache.
struct SequenceKv {
  std::vector<int32_t> pages;  // block table: slot s is on pages[s / block_size]
  int32_t num_slots = 0;       // tokens held by every (layer, kv head)
  int32_t budget = kUnboundedBudget;
  const EvictionPolicy* policy = nullptr;  // not owned; null: never evict (the `full` policy)
  int32_t peak_pages = 0;
  int64_t tokens_evicted = 0;  // per (layer, head): tokens dropped from the sequence so far
  // Endless streaming: positions the pinned prefix's keys are rotated past their own (0 until
  // the sequence first runs past the model's context; see engine/model_runner.cc).
  int32_t pinned_shift = 0;
};

// Tokens every head of `seq` keeps after a step that left it holding `held` (kv_cache.cc applies
// it in EvictHead and Commit): all of them without a policy or within the budget; else the
// budget at token granularity, and at page granularity the budget plus what is left over after
// whole pages (held - budget rounded down to a multiple of block_size) are evicted.
inline int32_t KeptAfterStep(const SequenceKv& seq, int32_t held, int32_t block_size) {
  if (seq.policy == nullptr || held <= seq.budget) return held;
  if (!seq.policy->page_granularity()) return seq.budget;
  return seq.budget + (held - seq.budget) % block_size;
}

// The most slots a sequence under `policy` with `budget` holds during a decode step (its new
// token appended, before it evicts): budget + 1, or budget + block_size at page granularity
// (KeptAfterStep leaves up to block_size - 1 over the budget). Admission sizes by this.
inline int64_t PeakDecodeSlots(const EvictionPolicy* policy, int32_t budget, int32_t block_size) {
  const bool page = policy != nullptr && policy->page_granularity();
  return int64_t(budget) + (page ? block_size : 1);
}

// Whether a step of `num_new` tokens of `seq` may run at positions past a context of `seq_len`
// tokens: its policy pins a prefix and evicts the rest oldest first (window, sink), with a budget
// above the prefix that leaves room for the step, so every query sees at most seq_len keys, the
// recent ones at their own distances and the pinned ones re-rotated to stay within the context.
inline bool StreamsPastContext(const SequenceKv& seq, int64_t num_new, int32_t seq_len) {
  if (seq.policy == nullptr) return false;
  const std::optional<int32_t> pinned = seq.policy->PinnedPrefix(seq.budget);
  return pinned.has_value() && *pinned < seq.budget && int64_t(seq.budget) + num_new <= seq_len;
}

// Where the K/V, pos and score arrays live (see Ownership above).
enum class KvStorage { kHost, kExternal };

class KvCache {
 public:
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(const KvShape& shape, int32_t num_pages,
                                                         KvStorage storage = KvStorage::kHost);
  // Number of pages that fit in `bytes` (at least 1).
  static int32_t PagesForBytes(const KvShape& shape, int64_t bytes);

  const KvShape& shape() const { return shape_; }
  const PageAllocator& allocator() const { return alloc_; }
  KvStorage storage() const { return storage_; }

  // Ensures seq has slots for `num_new` more tokens (num_slots + num_new). All-or-nothing: on
  // RESOURCE_EXHAUSTED nothing was allocated.
  absl::Status Reserve(SequenceKv& seq, int32_t num_new);
  // Pages a sequence needs to take `num_new` more tokens; 0 when it has room.
  int32_t PagesNeeded(const SequenceKv& seq, int32_t num_new) const;

  // View of (layer, kv_head) over `num_slots` slots (may exceed seq.num_slots during a step).
  PagedKvHead View(const SequenceKv& seq, int32_t layer, int32_t kv_head, int32_t num_slots);

  // After attention of a step in which (layer, kv_head) holds `held` tokens (the newest at
  // `newest_pos`, `num_new` of them appended by the step): when KeptAfterStep is below held, asks
  // the policy for the held - kept victims (whole pages at page granularity) and compacts the
  // survivors into slots [0, kept). Thread-safe across distinct (seq, layer, head).
  void EvictHead(const SequenceKv& seq, int32_t layer, int32_t kv_head, int32_t held,
                 int32_t newest_pos, int32_t num_new = 1);

  // Ends a step in which every head held `held` tokens: num_slots = KeptAfterStep(held); pages
  // past the last used slot go back to the pool.
  void Commit(SequenceKv& seq, int32_t held);
  // Drops the newest tokens so that seq holds `num_slots` (<= its current count) and returns the
  // pages past them. Valid only while no head has compacted since those tokens were appended
  // (e.g. a full-cache sequence): a rollback, as for a preempted or rejected suffix.
  void Truncate(SequenceKv& seq, int32_t num_slots);
  // Returns every page of seq to the pool and empties it (num_slots 0); its policy, budget and
  // counters stay, so a preempted sequence can be recomputed with the same settings.
  void Release(SequenceKv& seq);
  // Records the rotation of the pinned prefix's keys (the runner rotated them).
  void SetPinnedShift(SequenceKv& seq, int32_t shift) { seq.pinned_shift = shift; }

 private:
  KvCache(const KvShape& shape, int32_t num_pages, KvStorage storage);
  void FreeUnusedPages(SequenceKv& seq);
  void CheckHostStorage(const char* what) const;

  KvShape shape_;
  KvStorage storage_;
  PageAllocator alloc_;
  // [num_pages][num_layers][num_kv_heads][2][block_size][head_dim] elements of element_bytes.
  AlignedVector<float> kv_;
  // 64-byte aligned, so that at block size 16 the pos (or score) entries of one page of one
  // (layer, head) are exactly one cache line.
  AlignedVector<int32_t> pos_;  // [num_pages][num_layers][num_kv_heads][block_size]
  AlignedVector<float> score_;  // [num_pages][num_layers][num_kv_heads][block_size]
};

}  // namespace heavykv
