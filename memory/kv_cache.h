// KvCache: the one shared pool of fixed-size KV pages and the per-sequence block tables on it.
//
// The pool is allocated once at start. A page holds `block_size` token slots of one layer for
// every kv head (KvShape::table_per_layer, the host layout) or of every layer (the CUDA layout):
// K and V rows, and per slot the position of the token held and its score: the one channel its
// policy observes (kernels/slot_channel.h; h2o: accumulated attention). A sequence has a block
// table per layer (or one for all layers); every kv head of a layer holds the same number of
// tokens, so one table serves the layer's heads, yet each head keeps its own tokens: when a head
// evicts, a newer token of that head moves into the victim's slot (per-slot position and score
// make that legal). Per-head eviction is thus O(1) data movement per evicted token and needs no
// per-head tables. Layers may hold different numbers of tokens (layer budgets,
// memory/layer_budgets.h), and a layer's table holds only its own pages, so a layer with a
// smaller budget frees real memory.
//
// Ownership: KvCache owns all KV storage and is the only code that allocates, frees or compacts
// it. Callers own their SequenceKv values (ids only, no pointers) and may only change them
// through KvCache methods. The runner writes new K/V rows through View(); kernels read K/V and
// write the score channel through it.
//
// External storage (KvStorage::kExternal, the CUDA backend): KvCache still owns the page ids,
// block tables and slot counts (Reserve / CommitStep / Truncate / Release work as above), but
// holds no K/V, pos or score arrays. They live in device memory owned by the runner
// (engine/cuda/cuda_model_runner.h), with the same page layout (one table for all layers) and
// shape.element_bytes per K/V element; that runner appends, attends and evicts there, then calls
// CommitStep. View(), EvictHead() and SetLayerBudgets() are then unavailable (they abort).
//
// A step on a sequence: Reserve(n) -> kernels append n rows at slots [Slots(l), Slots(l) + n)
// of every (layer l, head) and attend -> EvictHead() on every (layer, head) -> CommitStep(n).
// Between steps layer l holds ceil(Slots(l) / block_size) <= ceil(b_l / block_size) pages of
// its table (one more at page granularity: KeptAfterStep), b_l its budget.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/aligned_vector.h"
#include "kernels/paged_kv.h"
#include "memory/eviction_policy.h"
#include "memory/layer_budgets.h"
#include "memory/page_allocator.h"
#include "memory/prefix_cache.h"
#include "memory/zeroed_vector.h"

namespace heavykv {

struct KvShape {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 16;
  int32_t element_bytes = 4;  // per K/V element: 4 (fp32) or 2 (bf16: --kv-dtype, and on a GPU)
  // Quantized K/V rows (--kv-dtype int8 | int4, kernels/kv_quant.h; host storage only): when set,
  // element_bytes is unused and a (layer, kv head) block of a page is [K data][V data][K
  // scales][V scales] of block_size rows each (docs/ARCHITECTURE.md "The KV pool").
  KvQuant quant = KvQuant::kNone;
  // A block table per layer, a page holding one layer (the host layout: layers may have
  // different budgets); false: one table for all layers, a page holding every layer (the CUDA
  // layout, kernels/cuda/device_kv.cuh; uniform budgets only).
  bool table_per_layer = false;

  int32_t NumTables() const { return table_per_layer ? num_layers : 1; }
  int32_t LayersPerPage() const { return table_per_layer ? 1 : num_layers; }
  // Bytes of one page: K+V rows plus position and score per slot, for its layers and kv heads.
  int64_t PageBytes() const;
  // Bytes of K and V (and their scales) of one slot of one (layer, kv head).
  int64_t SlotKvBytes() const;
  // Bytes of one page's K/V (and scales), metadata apart.
  int64_t PageKvBytes() const {
    return int64_t(LayersPerPage()) * num_kv_heads * block_size * SlotKvBytes();
  }
  int64_t PageFloats() const {
    return int64_t(LayersPerPage()) * num_kv_heads * 2 * block_size * head_dim;
  }
  int64_t PageMetaEntries() const { return int64_t(LayersPerPage()) * num_kv_heads * block_size; }
};

// The K/V element type of a shape: "fp32", "bf16", "int8" or "int4".
const char* KvElementName(const KvShape& shape);
// Pool bytes one token takes in every layer and kv head (K/V, scales, pos and score):
// PageBytes x NumTables / block_size.
inline int64_t KvBytesPerPoolToken(const KvShape& shape) {
  return shape.PageBytes() * shape.NumTables() / shape.block_size;
}

// Slots of a packed page: a pool page's K/V bytes (host layout: one layer) holding, for every
// kv head of its layer, [K data][V data][K scales][V scales][pos][score] of PackedBlockSize rows
// of `quant` (kernels/kv_quant.h). Pages of a format other than the pool's own, in the same pool
// (docs/ARCHITECTURE.md "Packed pages"): MiKV's demoted store (a policy's demote=) and a
// request's own kv_dtype (SequenceKv::quant). A multiple of 4; 0 when such a page would hold no
// more tokens than a page of the pool's own type (block_size), or the shape has no table per
// layer.
int32_t PackedBlockSize(const KvShape& shape, KvQuant quant);

// OK when `shape`'s pool can hold a sequence of row type `quant` (kNone: the pool's own) with a
// demoted store of `demote` (kNone: none): INVALID_ARGUMENT when a packed type is no narrower
// than the pages it would replace (PackedBlockSize 0, or a store no narrower than the
// sequence's rows), UNIMPLEMENTED without a table per layer. KvCache::CheckFormat and `plan`.
absl::Status CheckPackedFormats(const KvShape& shape, KvQuant demote, KvQuant quant);

// One block table and the tokens on it.
struct KvTable {
  std::vector<int32_t> pages;  // slot s is on pages[s / block_size]
  int32_t num_slots = 0;       // tokens held by every kv head of the table's layers
};

// One sequence's cache state. Mutated only by KvCache.
struct SequenceKv {
  // KvShape::NumTables() tables (a table per layer, or one for all); empty until the first
  // Reserve, and again after Release.
  std::vector<KvTable> tables;
  int32_t budget = kUnboundedBudget;  // per (layer, kv head); layer budgets keep the mean
  const EvictionPolicy* policy = nullptr;  // not owned; null: never evict (the `full` policy)
  // Per-layer budgets (policy->layer_budgets()), summing to num_layers * budget; empty: every
  // layer keeps `budget` (uniform, or squeeze before it has measured the layers).
  std::vector<int32_t> layer_budgets;
  bool layers_measured = false;  // squeeze: layer_budgets were set from a measurement
  // Squeeze's measurement so far (AddLayerSimilarity): per layer the summed cosine similarity
  // of the residual stream before and after attention, over `similarity_tokens` tokens.
  std::vector<double> layer_similarity;
  int32_t similarity_tokens = 0;
  int32_t peak_pages = 0;        // the most pages held at once, all tables together
  int64_t tokens_evicted = 0;    // per (layer, head), the mean over layers: tokens dropped so far
  int64_t layer_tokens_evicted = 0;  // the same summed over layers
  // Endless streaming: positions the pinned prefix's keys are rotated past their own (0 until
  // the sequence first runs past the model's context; see engine/runner/model_runner.cc).
  int32_t pinned_shift = 0;
  // The sequence's own K/V row type (a request's kv_dtype narrower than the pool's): its tables
  // are packed pages of PackedBlockSize(quant) slots (KvCache::BlockSize). kNone: the pool's.
  // Set before the first Reserve.
  KvQuant quant = KvQuant::kNone;
  // MiKV (policy->demote() set): per layer, the demoted store's table (packed pages of
  // PackedBlockSize(policy->demote()) slots; every kv head of the layer holds num_slots demoted
  // tokens); empty otherwise.
  std::vector<KvTable> demoted;
  // Prefix caching (docs/ARCHITECTURE.md "Prefix caching"; KvCache::FindPrefix, AttachPrefix,
  // RegisterPrefix). Set by the engine before admission: whether the sequence takes part, and
  // its tenant's chain root (PrefixCache::Root).
  bool prefix_enabled = false;
  uint64_t prefix_root = 0;
  // Registration so far (reset by Release): blocks [0, prefix_blocks) of its prompt are the
  // chain ending at entry prefix_entry, keyed prefix_hash.
  int32_t prefix_blocks = 0;
  int32_t prefix_entry = -1;
  uint64_t prefix_hash = 0;
  bool prefix_closed = false;  // it evicted, or registering failed: it registers no more
  bool prefix_grid = true;     // every prefill chunk so far ended on the chunk grid
  // A full-cache sequence's hit (it never writes into a slot it did not append): the prefix
  // cache's entries whose pages are the first shared.size() pages of each of its tables, read
  // only and pinned while it holds them (KvCache::Release unpins them and frees the rest).
  std::vector<int32_t> shared;

  // The table layer `layer` uses (an empty one before the first Reserve).
  const KvTable& Table(int32_t layer) const {
    static const KvTable kEmpty;
    if (tables.empty()) return kEmpty;
    return tables[tables.size() == 1 ? 0 : layer];
  }
  int32_t Slots(int32_t layer) const { return Table(layer).num_slots; }
  int32_t LayerBudget(int32_t layer) const {
    return layer_budgets.empty() ? budget : layer_budgets[layer];
  }
  // Pages held, all tables together (the demoted store's included).
  int64_t NumPages() const {
    int64_t n = 0;
    for (const KvTable& t : tables) n += static_cast<int64_t>(t.pages.size());
    for (const KvTable& t : demoted) n += static_cast<int64_t>(t.pages.size());
    return n;
  }
  // Demoted tokens of layer `layer` (per kv head).
  int32_t DemotedSlots(int32_t layer) const {
    return demoted.empty() ? 0 : demoted[layer].num_slots;
  }
  // The most demoted tokens a (layer, kv head) keeps: the policy's demote_budget, else budget.
  int32_t DemoteBudget() const {
    if (policy == nullptr || policy->demote() == KvQuant::kNone) return 0;
    return policy->demote_budget() > 0 ? policy->demote_budget() : budget;
  }
  // Of NumPages(), the pages the prefix cache shares with it (not its own).
  int64_t SharedPages() const {
    return static_cast<int64_t>(shared.size()) * static_cast<int64_t>(tables.size());
  }
  // Tokens held per (layer, kv head), the mean over layers (rounded down).
  int32_t MeanSlots() const {
    if (tables.empty()) return 0;
    int64_t n = 0;
    for (const KvTable& t : tables) n += t.num_slots;
    return static_cast<int32_t>(n / static_cast<int64_t>(tables.size()));
  }
};

// Tokens every head of a layer with `budget` under `policy` keeps after a step that left it
// holding `held` (kv_cache.cc applies it in EvictHead and CommitStep): all of them without a
// policy or within the budget; else the budget at token granularity, and at page granularity the
// budget plus what is left over after whole pages (held - budget rounded down to a multiple of
// block_size) are evicted.
inline int32_t KeptAfterStep(const EvictionPolicy* policy, int32_t budget, int32_t held,
                             int32_t block_size) {
  if (policy == nullptr || held <= budget) return held;
  if (!policy->page_granularity()) return budget;
  return budget + (held - budget) % block_size;
}
// The same for layer `layer` of `seq`.
inline int32_t KeptAfterStep(const SequenceKv& seq, int32_t layer, int32_t held,
                             int32_t block_size) {
  return KeptAfterStep(seq.policy, seq.LayerBudget(layer), held, block_size);
}

// The most slots a layer with `budget` under `policy` holds during a decode step (its new token
// appended, before it evicts): budget + 1, or budget + block_size at page granularity
// (KeptAfterStep leaves up to block_size - 1 over the budget). Admission sizes by this.
inline int64_t PeakDecodeSlots(const EvictionPolicy* policy, int32_t budget, int32_t block_size) {
  const bool page = policy != nullptr && policy->page_granularity();
  return int64_t(budget) + (page ? block_size : 1);
}

// The most pages a sequence of at most `max_total` tokens under `policy` (null: full) and
// `budget` holds between and during its decode steps, all tables together: per table
// ceil(min(max_total, PeakDecodeSlots(b_l)) / block_size), summed; with demote=, per layer
// ceil(min(max_total - budget, demote budget) / PackedBlockSize) more; with a sequence's own
// row type `quant`, its tables' slots a page are PackedBlockSize(quant). For squeeze, whose layer
// budgets are only known once it has filled its budget, the largest that sum can be for any budgets
// summing to L x budget (and what the uniform steps before hold is below it).
int64_t PeakPages(const KvShape& shape, const EvictionPolicy* policy, int32_t budget,
                  int32_t max_total, KvQuant quant = KvQuant::kNone);

// Whether a step of `num_new` tokens of `seq` may run at positions past a context of `seq_len`
// tokens: its policy pins a prefix and evicts the rest oldest first (window, sink) with uniform
// layer budgets, with a budget above the prefix that leaves room for the step, so every query
// sees at most seq_len keys, the recent ones at their own distances and the pinned ones
// re-rotated to stay within the context.
inline bool StreamsPastContext(const SequenceKv& seq, int64_t num_new, int32_t seq_len) {
  if (seq.policy == nullptr) return false;
  const std::optional<int32_t> pinned = seq.policy->PinnedPrefix(seq.budget);
  return pinned.has_value() && *pinned < seq.budget && int64_t(seq.budget) + num_new <= seq_len;
}

// Where the K/V, pos and score arrays live (see Ownership above).
enum class KvStorage { kHost, kExternal };

// Prefix caching's settings (KvCache::EnablePrefixCache).
struct PrefixCacheOptions {
  // The prefill chunk grid (the scheduler's prefill_chunk): score snapshots are taken only at
  // chunk ends on multiples of it, after chunks that all ended on it.
  int32_t chunk_grid = 256;
  // Most bytes of score snapshots held (host memory beside the pool); 0: an eighth of the pool.
  int64_t snapshot_bytes_limit = 0;
};

// A lookup's result (KvCache::FindPrefix): the first `tokens` prompt tokens are cached, in the
// chain `entries` (one per block), whose pages number `pages`.
struct PrefixHit {
  int32_t tokens = 0;
  std::vector<int32_t> entries;
  int64_t pages = 0;
  // A full-cache consumer shares the entries' pages instead of copying them (SequenceKv::shared);
  // new_pins of them are not pinned yet, i.e. stop being reclaimable when it takes them.
  bool shares = false;
  int64_t new_pins = 0;
};

struct PrefixStats {
  int64_t lookups = 0;          // admissions of sequences that take part
  int64_t hits = 0;             // of those, the ones that reused at least one block
  int64_t hit_tokens = 0;       // prompt tokens reused, summed
  int64_t registered_blocks = 0;
  int64_t reclaimed_pages = 0;  // cached pages given back to the pool for other uses
};

class KvCache {
 public:
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(const KvShape& shape, int32_t num_pages,
                                                         KvStorage storage = KvStorage::kHost);
  // Number of pages that fit in `bytes` (at least 1).
  static int32_t PagesForBytes(const KvShape& shape, int64_t bytes);

  const KvShape& shape() const { return shape_; }
  const PageAllocator& allocator() const { return alloc_; }
  KvStorage storage() const { return storage_; }

  // CheckPackedFormats for this pool, `quant` and `policy`'s demote= (null or none: none), and
  // UNIMPLEMENTED for either on external (device) storage. Reserve checks it on a sequence's
  // first step.
  absl::Status CheckFormat(const EvictionPolicy* policy, KvQuant quant = KvQuant::kNone) const;
  // Prefix caching (docs/ARCHITECTURE.md "Prefix caching"). Off until enabled; needs host
  // storage with a table per layer (FAILED_PRECONDITION otherwise). Cached pages come from the
  // pool and go back to it, least recently used first, whenever an allocation finds no free
  // page: they count as available (AvailablePages), never as owed to anyone.
  absl::Status EnablePrefixCache(const PrefixCacheOptions& options);
  bool SupportsPrefixCache() const {
    return storage_ == KvStorage::kHost && shape_.table_per_layer;
  }
  bool prefix_cache_enabled() const { return prefix_ != nullptr; }
  // Free pages plus the cached pages an allocation may reclaim (those no sequence shares).
  int32_t AvailablePages() const;
  // Pages held by the prefix cache (a sequence's only as shared, read-only pages).
  int32_t CachedPages() const;
  // Of CachedPages(), those full-cache sequences share (not reclaimable while they run).
  int32_t SharedCachedPages() const;
  const PrefixStats& prefix_stats() const { return prefix_stats_; }
  const PrefixCache* prefix_cache() const { return prefix_.get(); }
  // The longest cached prefix a sequence about to be admitted (no tables yet, prefix_enabled,
  // its pool's row type, not squeeze) may take of `prompt`: whole blocks, never the last prompt
  // token, at most its smallest layer budget when it has a policy (below its first eviction),
  // and for a policy with a channel only up to a block carrying a snapshot of that channel.
  // No side effects.
  PrefixHit FindPrefix(const SequenceKv& seq, std::span<const int32_t> prompt) const;
  // Counts a lookup and gives `seq` the hit's pages (every table then holds hit.tokens slots):
  // with hit.shares (a full-cache sequence) the cached pages themselves, pinned until Release;
  // else private copies with the snapshot's channel values. Returns the pages it took from
  // AvailablePages(): the copies, or the newly pinned pages (hit.new_pins). The caller made
  // room: for copies AvailablePages() - hit.pages >= them. `hit` must come from FindPrefix on
  // the unchanged cache; an empty hit only counts the lookup.
  int64_t AttachPrefix(SequenceKv& seq, const PrefixHit& hit);
  // After a step that left seq with `computed` tokens: registers copies of the prompt blocks
  // completed within [0, computed) (never past `prompt`), while the sequence has evicted
  // nothing, and a snapshot of its channel when `computed` is on the chunk grid. Pages for the
  // copies may reclaim older entries; when there are none, it stops registering.
  void RegisterPrefix(SequenceKv& seq, std::span<const int32_t> prompt, int32_t computed);

  // n choices of one request (docs/ARCHITECTURE.md "The sampling API"; memory/kv_fork.cc).
  // Fork gives `dst` (no tables yet) what `src` holds, between steps: its settings, counters and
  // tokens, on pages that are
  //  - for the full cache (no policy: it never writes into a slot it did not append) src's own
  //    whole pages, shared: one more holder each (a page goes back to the pool when its last
  //    holder drops it), and the prefix cache's entries src shares, pinned once more; the last,
  //    partly filled page of each table is copied (both append into it);
  //  - for a policy that evicts (it compacts, its channel is its own), private copies of every
  //    page, the demoted store's included.
  // UNIMPLEMENTED without host storage, RESOURCE_EXHAUSTED (nothing taken) when
  // AvailablePages() < ForkPages(src). dst never registers prefix blocks (src did) until a
  // Release starts it over.
  absl::Status Fork(const SequenceKv& src, SequenceKv& dst);
  // Pages Fork(src, ...) takes from AvailablePages().
  int64_t ForkPages(const SequenceKv& src) const;
  // Distinct pages with more than one holder (counted once in the pool; the scheduler adds them
  // once to what it promises).
  int32_t ForkSharedPages() const { return fork_shared_pages_; }
  // Of seq's pages, those it holds with other sequences (WorstCasePages leaves them out).
  int64_t ForkSharedPagesOf(const SequenceKv& seq) const;

  // Slots a page of seq's tables holds: shape().block_size, or PackedBlockSize(seq.quant).
  int32_t BlockSize(const SequenceKv& seq) const;
  // Ensures every table of seq has slots for `num_new` more tokens (Slots(l) + num_new).
  // All-or-nothing: on RESOURCE_EXHAUSTED nothing was allocated. The first Reserve of a sequence
  // sizes its tables and sets its layer budgets where they are known before it runs
  // (LayerBudgetsBeforeRun: uniform and pyramid; squeeze waits for SetLayerBudgets).
  absl::Status Reserve(SequenceKv& seq, int32_t num_new);
  // Pages a sequence needs to take `num_new` more tokens, all tables together; 0 when it has room.
  int32_t PagesNeeded(const SequenceKv& seq, int32_t num_new) const;
  // The most tokens (<= limit) the sequence could take with `pages` more pages.
  int32_t MaxNewTokens(const SequenceKv& seq, int64_t pages, int32_t limit) const;

  // View of (layer, kv_head) over `num_slots` slots (may exceed seq.Slots(layer) during a step).
  PagedKvHead View(const SequenceKv& seq, int32_t layer, int32_t kv_head, int32_t num_slots);
  // View of the demoted store of (layer, kv_head) (MiKV) over its seq.DemotedSlots(layer) slots:
  // quantized rows of policy->demote() on packed pages.
  PagedKvHead DemotedView(const SequenceKv& seq, int32_t layer, int32_t kv_head);

  // After attention of a step in which (layer, kv_head) holds `held` tokens (the newest at
  // `newest_pos`, `num_new` of them appended by the step): when KeptAfterStep (with the layer's
  // budget) is below held, asks the policy for the held - kept victims (whole pages at page
  // granularity) and compacts the survivors into slots [0, kept). With demote= (MiKV) the
  // victims go to the demoted store first (the lowest-ranked of it and them dropped past its
  // budget, into the pages Reserve took). Thread-safe across distinct (seq, layer, head).
  void EvictHead(const SequenceKv& seq, int32_t layer, int32_t kv_head, int32_t held,
                 int32_t newest_pos, int32_t num_new = 1);

  // Ends a step that appended `num_new` tokens to every layer (each layer's heads then held
  // Slots(l) + num_new): each table keeps KeptAfterStep of that with its layer's budget, and the
  // pages past its last used slot go back to the pool.
  void CommitStep(SequenceKv& seq, int32_t num_new);
  // Gives back the pages a Reserve added past every table's tokens (a step that did not run).
  void Unreserve(SequenceKv& seq);
  // Drops the newest tokens so that every table holds `num_slots` (<= each one's count) and
  // returns the pages past them. Valid only while no head has compacted since those tokens were
  // appended (e.g. a full-cache sequence): a rollback, as for a rejected suffix.
  void Truncate(SequenceKv& seq, int32_t num_slots);
  // Returns every page of seq to the pool and empties it (no tables); its policy, budget and
  // counters stay, so a preempted sequence can be recomputed with the same settings (squeeze
  // measures its layers again).
  void Release(SequenceKv& seq);
  // Records the rotation of the pinned prefix's keys (the runner rotated them).
  void SetPinnedShift(SequenceKv& seq, int32_t shift) { seq.pinned_shift = shift; }
  // Sets a sequence's per-layer budgets between steps (squeeze, once its measurement decided
  // the layers): [num_layers], each >= 1. A layer now above its budget evicts down to it at once
  // (the newest token at `newest_pos`) and frees its pages. Host storage with a table per layer
  // only.
  void SetLayerBudgets(SequenceKv& seq, std::vector<int32_t> budgets, int32_t newest_pos);
  // Squeeze (after CommitStep): adds a step's per-layer similarity sums over `tokens` tokens to
  // the sequence's measurement; once a layer holds the sequence's budget (the next step would
  // evict), sets the budgets SqueezeBudgets makes of the mean similarities (SetLayerBudgets).
  // Until then every layer keeps the uniform budget, which is all they hold anyway.
  void AddLayerSimilarity(SequenceKv& seq, std::span<const double> sums, int32_t tokens,
                          int32_t newest_pos);

 private:
  KvCache(const KvShape& shape, int32_t num_pages, KvStorage storage);
  // Drops the table's pages past its last used slot (DropPage).
  void FreeUnusedPages(KvTable& table, int32_t block_size);
  // Drops one holder of a sequence's page: back to the pool when it had no other.
  void DropPage(int32_t page);
  // Pages `table` (of `block_size` slots a page) needs to hold `num_new` more tokens.
  static int64_t TablePages(const KvTable& table, int32_t num_new, int32_t block_size);
  // View of `table`'s packed pages (PackedBlockSize(quant) slots each) for `kv_head`.
  PagedKvHead PackedView(const KvTable& table, KvQuant quant, int32_t kv_head,
                         int32_t num_slots);
  // A step's (or SetLayerBudgets') end for one table: it keeps `kept` tokens, `evicted` more
  // are counted (summed over the table's layers), and the pages past its last slot go back.
  void ShrinkTable(SequenceKv& seq, KvTable& table, int32_t kept, int64_t evicted);
  // Demoted tokens layer `layer` holds after a step in which it held `held` (<= the demote
  // budget: the store takes the step's victims up to it).
  int32_t DemotedAfterStep(const SequenceKv& seq, int32_t layer, int32_t held) const;
  // Moves the step's victims (slots of h, sorted) of (layer, kv_head) into its demoted store
  // (EvictHead, before compaction overwrites them).
  void Demote(const SequenceKv& seq, int32_t layer, int32_t kv_head, const PagedKvHead& h,
              std::span<const int32_t> victims);
  void CheckHostStorage(const char* what) const;
  // The first Reserve's set-up of a sequence with no tables (layer budgets, format check).
  absl::Status InitTables(SequenceKv& seq) const;
  // A free page, reclaiming cached pages when the free list is empty; nullopt when neither has
  // one.
  std::optional<int32_t> TakePage();
  // TakePage where the caller checked that a page is available (a broken invariant otherwise).
  int32_t MustTakePage();
  // Copies a host page (K/V, pos, score) onto another.
  void CopyPage(int32_t from, int32_t to);

  KvShape shape_;
  KvStorage storage_;
  PageAllocator alloc_;
  // Holders of each page beyond the first (Fork's shared pages; 0 for almost every page), and
  // how many pages have any.
  std::vector<uint16_t> page_refs_;
  int32_t fork_shared_pages_ = 0;
  // [num_pages][LayersPerPage][num_kv_heads][2][block_size][head_dim] elements of element_bytes.
  // Zeroed without being written (ZeroedVector): a page's memory becomes resident when it is
  // first written, so a large pool costs what its sequences have used, up to its size.
  ZeroedVector<float> kv_;
  // 64-byte aligned, so that at block size 16 the pos (or score) entries of one page of one
  // (layer, head) are exactly one cache line.
  ZeroedVector<int32_t> pos_;  // [num_pages][LayersPerPage][num_kv_heads][block_size]
  ZeroedVector<float> score_;  // [num_pages][LayersPerPage][num_kv_heads][block_size]
  std::unique_ptr<PrefixCache> prefix_;  // null: prefix caching off
  PrefixCacheOptions prefix_options_;
  PrefixStats prefix_stats_;
};

}  // namespace heavykv
