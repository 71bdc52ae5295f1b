#include "memory/prefix_cache.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace heavykv {
namespace {

// SplitMix64's finaliser: every input bit reaches every output bit.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

[[noreturn]] void Broken(const char* what, int32_t id) {
  std::fprintf(stderr, "PrefixCache: %s (entry %d)\n", what, id);
  std::abort();
}

}  // namespace

uint64_t PrefixCache::Root(std::string_view tenant) {
  uint64_t h = Mix(0x686561766b76ULL);  // "heavykv"
  for (unsigned char c : tenant) h = Mix(h ^ c);
  return Mix(h ^ tenant.size());
}

uint64_t PrefixCache::Next(uint64_t parent_hash, std::span<const int32_t> tokens) {
  uint64_t h = Mix(parent_hash);
  for (int32_t t : tokens) h = Mix(h ^ static_cast<uint32_t>(t));
  return Mix(h ^ tokens.size());
}

int32_t PrefixCache::Find(uint64_t hash, int32_t parent, std::span<const int32_t> tokens) const {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return -1;
  const PrefixEntry& e = entries_[static_cast<size_t>(it->second)];
  if (e.parent != parent || !std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin(),
                                        tokens.end())) {
    return -1;
  }
  return it->second;
}

std::optional<int32_t> PrefixCache::Insert(uint64_t hash, int32_t parent,
                                           std::span<const int32_t> tokens,
                                           std::vector<int32_t> pages) {
  if (by_hash_.count(hash) != 0) return std::nullopt;
  int32_t id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    id = static_cast<int32_t>(entries_.size());
    entries_.emplace_back();
  }
  PrefixEntry& e = entries_[static_cast<size_t>(id)];
  e = PrefixEntry();
  e.hash = hash;
  e.parent = parent;
  e.tokens.assign(tokens.begin(), tokens.end());
  num_pages_ += static_cast<int64_t>(pages.size());
  e.pages = std::move(pages);
  e.tick = ++clock_;
  e.live = true;
  by_hash_.emplace(hash, id);
  if (parent >= 0) {
    Unlist(parent);
    ++entries_[static_cast<size_t>(parent)].children;
  }
  List(id);
  return id;
}

void PrefixCache::Unlist(int32_t id) {
  const PrefixEntry& e = entries_[static_cast<size_t>(id)];
  leaves_.erase({e.tick, id});
}

void PrefixCache::List(int32_t id) {
  const PrefixEntry& e = entries_[static_cast<size_t>(id)];
  if (Reclaimable(e)) leaves_.insert({e.tick, id});
}

void PrefixCache::Touch(int32_t id) {
  Unlist(id);
  entries_[static_cast<size_t>(id)].tick = ++clock_;
  List(id);
}

void PrefixCache::Pin(int32_t id) {
  Unlist(id);
  PrefixEntry& e = entries_[static_cast<size_t>(id)];
  if (e.pins++ == 0) pinned_pages_ += static_cast<int64_t>(e.pages.size());
}

void PrefixCache::Unpin(int32_t id) {
  PrefixEntry& e = entries_[static_cast<size_t>(id)];
  if (e.pins <= 0) Broken("unpinned more often than pinned", id);
  if (--e.pins == 0) pinned_pages_ -= static_cast<int64_t>(e.pages.size());
  List(id);
}

int32_t PrefixCache::Victim() const { return leaves_.empty() ? -1 : leaves_.begin()->second; }

std::vector<int32_t> PrefixCache::Remove(int32_t id) {
  PrefixEntry& e = entries_[static_cast<size_t>(id)];
  if (!e.live || !Reclaimable(e)) Broken("removing an entry in use", id);
  Unlist(id);
  by_hash_.erase(e.hash);
  if (e.parent >= 0) {
    PrefixEntry& p = entries_[static_cast<size_t>(e.parent)];
    --p.children;
    List(e.parent);
  }
  for (const PrefixSnapshot& s : e.snapshots) {
    snapshot_bytes_ -= static_cast<int64_t>(s.scores.size() * sizeof(float));
  }
  std::vector<int32_t> pages = std::move(e.pages);
  num_pages_ -= static_cast<int64_t>(pages.size());
  e = PrefixEntry();
  free_ids_.push_back(id);
  return pages;
}

void PrefixCache::AddSnapshot(int32_t id, PrefixSnapshot snapshot) {
  snapshot_bytes_ += static_cast<int64_t>(snapshot.scores.size() * sizeof(float));
  entries_[static_cast<size_t>(id)].snapshots.push_back(std::move(snapshot));
}

bool PrefixCache::CheckInvariants() const {
  std::vector<int32_t> children(entries_.size(), 0);
  int64_t pages = 0, bytes = 0, live = 0, pinned = 0;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const PrefixEntry& e = entries_[i];
    if (!e.live) continue;
    ++live;
    pages += static_cast<int64_t>(e.pages.size());
    if (e.pins > 0) pinned += static_cast<int64_t>(e.pages.size());
    for (const PrefixSnapshot& s : e.snapshots) bytes += int64_t(s.scores.size() * sizeof(float));
    if (e.parent >= 0) {
      if (!entries_[static_cast<size_t>(e.parent)].live) return false;
      ++children[static_cast<size_t>(e.parent)];
    }
    auto it = by_hash_.find(e.hash);
    if (it == by_hash_.end() || it->second != static_cast<int32_t>(i)) return false;
    const bool listed = leaves_.count({e.tick, static_cast<int32_t>(i)}) != 0;
    if (listed != Reclaimable(e)) return false;
  }
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].live && entries_[i].children != children[i]) return false;
  }
  return live == num_entries() && pages == num_pages_ && bytes == snapshot_bytes_ &&
         pinned == pinned_pages_ &&
         static_cast<int64_t>(leaves_.size()) <= live;
}

}  // namespace heavykv
