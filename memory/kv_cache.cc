#include "memory/kv_cache.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace heavykv {

int64_t KvShape::PageBytes() const {
  return PageFloats() * int64_t(element_bytes) +
         PageMetaEntries() * int64_t(sizeof(int32_t) + sizeof(float));
}

int32_t KvCache::PagesForBytes(const KvShape& shape, int64_t bytes) {
  return static_cast<int32_t>(std::max<int64_t>(1, bytes / shape.PageBytes()));
}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const KvShape& shape,
                                                         int32_t num_pages, KvStorage storage) {
  if (shape.num_layers <= 0 || shape.num_kv_heads <= 0 || shape.head_dim <= 0) {
    return absl::InvalidArgumentError("KV shape must have positive layers, kv heads, head_dim");
  }
  if (shape.block_size <= 0 || shape.block_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("block size must be in [1, 1024], got ", shape.block_size));
  }
  if (num_pages <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("KV pool needs at least one page, got ",
                                                   num_pages));
  }
  if (shape.element_bytes != 2 && shape.element_bytes != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV element_bytes must be 2 or 4, got ", shape.element_bytes));
  }
  return std::unique_ptr<KvCache>(new KvCache(shape, num_pages, storage));
}

KvCache::KvCache(const KvShape& shape, int32_t num_pages, KvStorage storage)
    : shape_(shape),
      storage_(storage),
      alloc_(num_pages),
      // fp32 elements, or two bf16 elements per float (PageFloats() is even: K and V).
      kv_(storage == KvStorage::kHost
              ? static_cast<size_t>(shape.PageFloats() / (4 / shape.element_bytes)) * num_pages
              : 0),
      pos_(storage == KvStorage::kHost ? static_cast<size_t>(shape.PageMetaEntries()) * num_pages
                                       : 0),
      score_(storage == KvStorage::kHost
                 ? static_cast<size_t>(shape.PageMetaEntries()) * num_pages
                 : 0) {}

void KvCache::CheckHostStorage(const char* what) const {
  if (storage_ == KvStorage::kHost) return;
  std::fprintf(stderr, "KvCache::%s on external storage: the device runner owns the K/V\n", what);
  std::abort();
}

int32_t KvCache::PagesNeeded(const SequenceKv& seq, int32_t num_new) const {
  int64_t slots = int64_t(seq.num_slots) + num_new;
  int64_t pages = (slots + shape_.block_size - 1) / shape_.block_size;
  return static_cast<int32_t>(std::max<int64_t>(0, pages - int64_t(seq.pages.size())));
}

absl::Status KvCache::Reserve(SequenceKv& seq, int32_t num_new) {
  int32_t need = PagesNeeded(seq, num_new);
  if (need > alloc_.num_pages_free()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV pool has ", alloc_.num_pages_free(),
                                                     " free pages, sequence needs ", need));
  }
  for (int32_t i = 0; i < need; ++i) seq.pages.push_back(*alloc_.Allocate());
  seq.peak_pages = std::max<int32_t>(seq.peak_pages, static_cast<int32_t>(seq.pages.size()));
  return absl::OkStatus();
}

PagedKvHead KvCache::View(const SequenceKv& seq, int32_t layer, int32_t kv_head,
                          int32_t num_slots) {
  CheckHostStorage("View");
  const int64_t bs = shape_.block_size, hd = shape_.head_dim;
  const int64_t lh = int64_t(layer) * shape_.num_kv_heads + kv_head;
  PagedKvHead v;
  v.pages = seq.pages.data();
  v.num_slots = num_slots;
  v.block_size = shape_.block_size;
  v.head_dim = shape_.head_dim;
  v.page_stride = shape_.PageFloats();
  if (shape_.element_bytes == 2) {
    v.k16 = reinterpret_cast<uint16_t*>(kv_.data()) + lh * 2 * bs * hd;
    v.v16 = v.k16 + bs * hd;
  } else {
    v.k = kv_.data() + lh * 2 * bs * hd;
    v.v = v.k + bs * hd;
  }
  v.meta_page_stride = shape_.PageMetaEntries();
  v.pos = pos_.data() + lh * bs;
  v.score = score_.data() + lh * bs;
  return v;
}

void KvCache::EvictHead(const SequenceKv& seq, int32_t layer, int32_t kv_head, int32_t held,
                        int32_t newest_pos, int32_t num_new) {
  const int32_t keep = KeptAfterStep(seq, held, shape_.block_size);
  if (keep == held) return;
  CheckHostStorage("EvictHead");
  const int32_t num_evict = held - keep;
  PagedKvHead h = View(seq, layer, kv_head, held);

  // Gather the policy's plain view, a page at a time. Per-thread scratch: EvictHead runs inside
  // parallel loops.
  thread_local std::vector<int32_t> pos, victims;
  thread_local std::vector<float> score;
  const bool scores = seq.policy->needs_scores();
  pos.resize(held);
  if (scores) score.resize(held);
  const int32_t bs = shape_.block_size;
  for (int32_t s0 = 0; s0 < held; s0 += bs) {
    const int64_t meta = int64_t(h.pages[s0 / bs]) * h.meta_page_stride;
    const int32_t rows = std::min(bs, held - s0);
    if (rows == 16) {  // the default block size: fixed-size copies the compiler inlines
      std::memcpy(&pos[s0], h.pos + meta, 16 * sizeof(int32_t));
      if (scores) std::memcpy(&score[s0], h.score + meta, 16 * sizeof(float));
      continue;
    }
    std::memcpy(&pos[s0], h.pos + meta, rows * sizeof(int32_t));
    if (scores) std::memcpy(&score[s0], h.score + meta, rows * sizeof(float));
  }
  HeadSlots slots{pos, {}};
  if (scores) slots.score = score;
  victims.clear();
  const EvictionStep step{seq.budget, newest_pos, num_evict, num_new};
  if (seq.policy->page_granularity()) {
    seq.policy->ChoosePageVictims(slots, step, bs, &victims);
  } else {
    seq.policy->ChooseVictims(slots, step, &victims);
  }

  // Sorted, the victims below the budget are the holes in order, and the slots from the budget
  // up that are not victims are the survivors to move into them: O(num_evict), no scan of the
  // held slots.
  std::sort(victims.begin(), victims.end());
  for (size_t i = 0; i < victims.size(); ++i) {
    if (victims[i] < 0 || victims[i] >= held || (i > 0 && victims[i] == victims[i - 1])) {
      std::fprintf(stderr, "policy %s chose an invalid or repeated victim slot %d\n",
                   std::string(seq.policy->name()).c_str(), victims[i]);
      std::abort();
    }
  }
  if (static_cast<int32_t>(victims.size()) != num_evict) {
    std::fprintf(stderr, "policy %s chose %zu victims, %d needed\n",
                 std::string(seq.policy->name()).c_str(), victims.size(), num_evict);
    std::abort();
  }
  // Survivors beyond `keep` move into the holes left by victims below it.
  size_t above = std::lower_bound(victims.begin(), victims.end(), keep) - victims.begin();
  int32_t mover = keep;
  for (size_t i = 0; i < victims.size() && victims[i] < keep; ++i) {
    const int32_t hole = victims[i];
    for (; above < victims.size() && victims[above] == mover; ++above) ++mover;
    h.MoveRows(hole, mover);
    h.Pos(hole) = h.Pos(mover);
    h.Score(hole) = h.Score(mover);
    ++mover;
  }
}

void KvCache::Commit(SequenceKv& seq, int32_t held) {
  const int32_t kept = KeptAfterStep(seq, held, shape_.block_size);
  seq.tokens_evicted += held - kept;
  seq.num_slots = kept;
  FreeUnusedPages(seq);
}

void KvCache::Truncate(SequenceKv& seq, int32_t num_slots) {
  if (num_slots < 0 || num_slots > seq.num_slots) {
    std::fprintf(stderr, "KvCache::Truncate to %d slots of %d\n", num_slots, seq.num_slots);
    std::abort();
  }
  seq.num_slots = num_slots;
  FreeUnusedPages(seq);
}

void KvCache::FreeUnusedPages(SequenceKv& seq) {
  const size_t pages_used = (size_t(seq.num_slots) + shape_.block_size - 1) / shape_.block_size;
  while (seq.pages.size() > pages_used) {
    alloc_.Free(seq.pages.back());
    seq.pages.pop_back();
  }
}

void KvCache::Release(SequenceKv& seq) {
  for (int32_t p : seq.pages) alloc_.Free(p);
  seq.pages.clear();
  seq.num_slots = 0;
  seq.pinned_shift = 0;  // the rotated keys are gone
}

}  // namespace heavykv
