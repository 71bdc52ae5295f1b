// KvCache::Fork: n choices of one request on one prompt's pages (kv_cache.h; docs/ARCHITECTURE.md
// "The sampling API").
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "memory/kv_cache.h"
#include "memory/prefix_cache.h"

namespace heavykv {
namespace {

// Whether Fork shares src's whole pages: the full cache never writes into a slot it did not
// append, so a page both hold stays what it was for both.
bool SharesPages(const SequenceKv& src) { return src.policy == nullptr; }

}  // namespace

int64_t KvCache::ForkPages(const SequenceKv& src) const {
  const int32_t bs = BlockSize(src);
  int64_t pages = 0;
  for (const KvTable& t : src.tables) {
    const size_t used = size_t(TablePages(t, 0, bs));
    if (SharesPages(src)) {
      pages += (t.num_slots % bs != 0 && used > src.shared.size()) ? 1 : 0;
    } else {
      pages += static_cast<int64_t>(used - std::min(used, src.shared.size()));
    }
  }
  if (!src.demoted.empty()) {
    const int32_t bd = PackedBlockSize(shape_, src.policy->demote());
    for (const KvTable& t : src.demoted) pages += TablePages(t, 0, bd);
  }
  return pages;
}

absl::Status KvCache::Fork(const SequenceKv& src, SequenceKv& dst) {
  if (storage_ != KvStorage::kHost) {
    return absl::UnimplementedError("forking a sequence's pages needs host storage (the CPU)");
  }
  if (!dst.tables.empty() || src.tables.empty()) {
    return absl::FailedPreconditionError("Fork needs a source with tables and a target without");
  }
  const int64_t need = ForkPages(src);
  if (need > AvailablePages()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("forking needs ", need, " pages, ", AvailablePages(), " are available"));
  }
  dst = src;  // settings, counters, layer budgets, squeeze's measurement; pages replaced below
  dst.prefix_closed = true;  // src registered the prompt's blocks
  for (int32_t id : dst.shared) prefix_->Pin(id);
  const int32_t bs = BlockSize(src);
  const size_t shared = src.shared.size();
  auto copy_of = [&](int32_t page) {
    const int32_t to = MustTakePage();
    CopyPage(page, to);
    return to;
  };
  for (size_t t = 0; t < dst.tables.size(); ++t) {
    KvTable& table = dst.tables[t];
    table.pages.resize(size_t(TablePages(table, 0, bs)));  // a reserve src holds past its slots stays
    for (size_t i = shared; i < table.pages.size(); ++i) {
      const int32_t page = table.pages[i];
      const bool whole = (int64_t(i) + 1) * bs <= table.num_slots;
      if (!SharesPages(src) || !whole) {
        table.pages[i] = copy_of(page);
        continue;
      }
      uint16_t& refs = page_refs_[size_t(page)];
      if (refs == UINT16_MAX) {  // never with the engine's --max-n; a broken invariant
        std::fprintf(stderr, "KvCache::Fork: page %d has too many holders\n", page);
        std::abort();
      }
      if (refs++ == 0) ++fork_shared_pages_;
    }
  }
  if (!dst.demoted.empty()) {
    const int32_t bd = PackedBlockSize(shape_, src.policy->demote());
    for (KvTable& table : dst.demoted) {
      table.pages.resize(size_t(TablePages(table, 0, bd)));
      for (int32_t& page : table.pages) page = copy_of(page);
    }
  }
  dst.peak_pages = static_cast<int32_t>(dst.NumPages());
  return absl::OkStatus();
}

int64_t KvCache::ForkSharedPagesOf(const SequenceKv& seq) const {
  if (fork_shared_pages_ == 0 || !SharesPages(seq)) return 0;
  int64_t n = 0;
  for (const KvTable& t : seq.tables) {
    for (size_t i = seq.shared.size(); i < t.pages.size(); ++i) {
      n += page_refs_[size_t(t.pages[i])] > 0 ? 1 : 0;
    }
  }
  return n;
}

}  // namespace heavykv
