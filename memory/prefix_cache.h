// PrefixCache: the index of cached prompt blocks (automatic prefix caching, issue 30).
//
// docs/ARCHITECTURE.md "Prefix caching" is the contract. A block is block_size prompt tokens at
// positions [k bs, (k+1) bs); its entry names the pool pages (one per layer table) that hold
// their K/V and positions, computed before the producing sequence first evicted anything, so
// they are what a full-cache run holds whatever the producer's policy. Entries form chains:
// an entry's key is h_k = Next(h_{k-1}, tokens of block k), h_{-1} = Root(tenant). A lookup
// walks the chain and compares each entry's parent and token ids, so a hash collision is a miss,
// never wrong tokens. An entry may carry score snapshots: for one ChannelSpec, the channel value
// of every slot [0, end of the block) of every (layer, kv head) as it stood at the end of the
// producer's prefill chunk ending there (taken only on the chunk grid; see KvCache).
//
// This class only indexes: it never reads or writes page contents and never allocates pages
// (KvCache, which owns the pool, copies pages in and out and hands it page ids). Reclaim order
// is least recently used among the leaves (entries without children) that nobody pins, so no
// entry outlives its parent. Not thread-safe: the engine thread owns it (through KvCache).
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/slot_channel.h"

namespace heavykv {

struct PrefixSnapshot {
  ChannelSpec spec;
  std::vector<float> scores;  // [num_layers][num_kv_heads][tokens]: slot s holds position s
};

struct PrefixEntry {
  uint64_t hash = 0;
  int32_t parent = -1;              // entry id; -1: the first block of its chain
  std::vector<int32_t> tokens;      // the block's token ids
  std::vector<int32_t> pages;       // pool pages, one per layer table
  std::vector<PrefixSnapshot> snapshots;
  int32_t children = 0;             // entries whose parent this is
  // > 0: in use (a KvCache call copying it, or sequences whose tables share its pages); not
  // reclaimable.
  int32_t pins = 0;
  uint64_t tick = 0;                // last use, for LRU
  bool live = false;
};

class PrefixCache {
 public:
  // The chain root of a tenant ("" when tenants share, or without API keys).
  static uint64_t Root(std::string_view tenant);
  // The key of the block `tokens` following the block (or root) keyed `parent_hash`.
  static uint64_t Next(uint64_t parent_hash, std::span<const int32_t> tokens);

  // The live entry keyed `hash` whose parent is `parent` and whose tokens are `tokens`; -1 when
  // there is none (a collision with another block is a miss).
  int32_t Find(uint64_t hash, int32_t parent, std::span<const int32_t> tokens) const;
  // Adds an entry holding `pages` (ownership of the page ids passes to the cache) and returns
  // its id; nullopt (nothing taken) when `hash` is already another entry's key.
  std::optional<int32_t> Insert(uint64_t hash, int32_t parent, std::span<const int32_t> tokens,
                                std::vector<int32_t> pages);
  // Whether entry `id` is still the one keyed `hash` (it may have been reclaimed since).
  bool Holds(int32_t id, uint64_t hash) const {
    auto it = by_hash_.find(hash);
    return it != by_hash_.end() && it->second == id;
  }
  // Marks an entry used now (LRU).
  void Touch(int32_t id);
  // Pins nest (a count); an entry with pins is never a Victim.
  void Pin(int32_t id);
  void Unpin(int32_t id);
  // The least recently used reclaimable leaf, or -1.
  int32_t Victim() const;
  // Drops a reclaimable leaf and returns its pages (the caller frees them).
  std::vector<int32_t> Remove(int32_t id);
  // Adds a snapshot to an entry (snapshot_bytes() counts its scores).
  void AddSnapshot(int32_t id, PrefixSnapshot snapshot);

  const PrefixEntry& entry(int32_t id) const { return entries_[static_cast<size_t>(id)]; }
  int64_t num_entries() const { return static_cast<int64_t>(by_hash_.size()); }
  int64_t num_pages() const { return num_pages_; }
  // Pages of pinned entries (not reclaimable).
  int64_t pinned_pages() const { return pinned_pages_; }
  int64_t snapshot_bytes() const { return snapshot_bytes_; }

  // Verifies the structure (children counts, the leaf set, page totals) in O(entries); tests.
  bool CheckInvariants() const;

 private:
  bool Reclaimable(const PrefixEntry& e) const { return e.children == 0 && e.pins == 0; }
  void Unlist(int32_t id);  // out of the reclaim set, if in it
  void List(int32_t id);    // into it, if reclaimable

  std::vector<PrefixEntry> entries_;
  std::vector<int32_t> free_ids_;
  std::unordered_map<uint64_t, int32_t> by_hash_;
  std::set<std::pair<uint64_t, int32_t>> leaves_;  // (tick, id) of the reclaimable entries
  uint64_t clock_ = 0;
  int64_t num_pages_ = 0;
  int64_t pinned_pages_ = 0;
  int64_t snapshot_bytes_ = 0;
};

}  // namespace heavykv
