#include "memory/kv_cache.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace heavykv {

namespace {

// Bytes of one packed slot of one kv head: K and V rows of `quant` with scales, pos and score.
int64_t PackedSlotBytes(const KvShape& shape, KvQuant quant) {
  return 2 * int64_t(KvQuantDataBytes(quant, shape.head_dim) +
                     KvQuantScaleBytes(quant, shape.head_dim)) +
         int64_t(sizeof(int32_t) + sizeof(float));
}

}  // namespace

int64_t KvShape::SlotKvBytes() const {
  if (quant == KvQuant::kNone) return 2 * int64_t(head_dim) * element_bytes;
  return 2 * int64_t(KvQuantDataBytes(quant, head_dim) + KvQuantScaleBytes(quant, head_dim));
}

const char* KvElementName(const KvShape& shape) {
  if (shape.quant != KvQuant::kNone) return KvQuantName(shape.quant);
  return shape.element_bytes == 2 ? "bf16" : "fp32";
}

int64_t KvShape::PageBytes() const {
  return PageKvBytes() + PageMetaEntries() * int64_t(sizeof(int32_t) + sizeof(float));
}

int32_t PackedBlockSize(const KvShape& shape, KvQuant quant) {
  if (quant == KvQuant::kNone || !shape.table_per_layer || !KvQuantTakes(quant, shape.head_dim)) {
    return 0;
  }
  const int64_t page = shape.PageKvBytes();
  if (page % 4 != 0) return 0;  // pos and score are addressed in 4-byte units
  const int64_t rows = page / (int64_t(shape.num_kv_heads) * PackedSlotBytes(shape, quant));
  const int64_t bd = rows / 4 * 4;
  return bd > shape.block_size ? static_cast<int32_t>(bd) : 0;
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
  if (shape.quant != KvQuant::kNone) {
    if (storage != KvStorage::kHost) {
      return absl::UnimplementedError("quantized K/V pages need host storage (the CPU backend)");
    }
    if (!KvQuantTakes(shape.quant, shape.head_dim)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "quantized K/V needs a head_dim of at most 1024 (and even for int4), got ",
          shape.head_dim));
    }
  } else if (shape.element_bytes != 2 && shape.element_bytes != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV element_bytes must be 2 or 4, got ", shape.element_bytes));
  }
  return std::unique_ptr<KvCache>(new KvCache(shape, num_pages, storage));
}

KvCache::KvCache(const KvShape& shape, int32_t num_pages, KvStorage storage)
    : shape_(shape),
      storage_(storage),
      alloc_(num_pages),
      page_refs_(static_cast<size_t>(num_pages), 0),
      // The pages' K/V bytes, in floats (rounded up for quantized rows).
      kv_(storage == KvStorage::kHost
              ? static_cast<size_t>((shape.PageKvBytes() * num_pages + 3) / 4)
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

int64_t PeakPages(const KvShape& shape, const EvictionPolicy* policy, int32_t budget,
                  int32_t max_total, KvQuant quant) {
  const int32_t packed = quant != KvQuant::kNone ? PackedBlockSize(shape, quant) : 0;
  const int64_t bs = packed > 0 ? packed : shape.block_size, tables = shape.NumTables();
  auto pages = [&](int64_t slots) { return (std::min<int64_t>(slots, max_total) + bs - 1) / bs; };
  if (policy == nullptr || budget >= max_total) return tables * pages(max_total);
  const int64_t extra = PeakDecodeSlots(policy, budget, static_cast<int32_t>(bs)) - budget;
  const LayerBudgets rule =
      shape.table_per_layer ? policy->layer_budgets() : LayerBudgets::kUniform;
  if (rule == LayerBudgets::kSqueeze) {
    // sum_l ceil((b_l + extra) / bs) <= floor(sum_l (b_l + extra + bs - 1) / bs) whatever the
    // b_l summing to L x budget.
    const int64_t bound = (tables * (budget + extra) + tables * (bs - 1)) / bs;
    return std::min(tables * pages(max_total), bound);
  }
  if (rule == LayerBudgets::kUniform) {
    int64_t demoted = 0;  // MiKV (uniform layers only): the demoted store at its budget
    const int32_t bd = PackedBlockSize(shape, policy->demote());
    if (bd > 0) {
      const int64_t held = std::min<int64_t>(
          int64_t(max_total) - budget,
          policy->demote_budget() > 0 ? policy->demote_budget() : budget);
      demoted = tables * ((held + bd - 1) / bd);
    }
    return tables * pages(budget + extra) + demoted;
  }
  int64_t sum = 0;
  for (int32_t b : LayerBudgetsBeforeRun(rule, budget, shape.num_layers)) sum += pages(b + extra);
  return sum;
}

int64_t KvCache::TablePages(const KvTable& table, int32_t num_new, int32_t block_size) {
  return (int64_t(table.num_slots) + num_new + block_size - 1) / block_size;
}

int32_t KvCache::BlockSize(const SequenceKv& seq) const {
  if (seq.quant == KvQuant::kNone) return shape_.block_size;
  const int32_t packed = PackedBlockSize(shape_, seq.quant);
  return packed > 0 ? packed : shape_.block_size;  // CheckFormat refuses the latter
}

int32_t KvCache::DemotedAfterStep(const SequenceKv& seq, int32_t layer, int32_t held) const {
  const int32_t evicted = held - KeptAfterStep(seq, layer, held, BlockSize(seq));
  return static_cast<int32_t>(
      std::min<int64_t>(seq.DemoteBudget(), int64_t(seq.DemotedSlots(layer)) + evicted));
}

int32_t KvCache::PagesNeeded(const SequenceKv& seq, int32_t num_new) const {
  int64_t need = 0;
  const int32_t bs = BlockSize(seq);
  for (int32_t t = 0; t < shape_.NumTables(); ++t) {
    const KvTable& table = seq.Table(t);
    need += std::max<int64_t>(0, TablePages(table, num_new, bs) - int64_t(table.pages.size()));
  }
  const int32_t bd = seq.DemoteBudget() > 0 ? PackedBlockSize(shape_, seq.policy->demote()) : 0;
  if (bd > 0) {  // MiKV: the demoted store takes the step's victims
    for (int32_t l = 0; l < shape_.num_layers; ++l) {
      const int64_t have = seq.demoted.empty() ? 0 : int64_t(seq.demoted[l].pages.size());
      const int64_t slots = DemotedAfterStep(seq, l, seq.Slots(l) + num_new);
      need += std::max<int64_t>(0, (slots + bd - 1) / bd - have);
    }
  }
  return static_cast<int32_t>(need);
}

int32_t KvCache::MaxNewTokens(const SequenceKv& seq, int64_t pages, int32_t limit) const {
  // PagesNeeded grows with the count: the largest count within `pages`, by bisection.
  int32_t lo = 0, hi = std::max(0, limit);
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo + 1) / 2;
    if (PagesNeeded(seq, mid) <= pages) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

absl::Status CheckPackedFormats(const KvShape& shape, KvQuant demote, KvQuant quant) {
  if (quant == KvQuant::kNone && demote == KvQuant::kNone) return absl::OkStatus();
  if (!shape.table_per_layer) {
    return absl::UnimplementedError(absl::StrCat(
        quant != KvQuant::kNone ? "a request's own kv_dtype" : "demote=",
        " needs the CPU layout (a block table per layer)"));
  }
  const int32_t rows = quant != KvQuant::kNone ? PackedBlockSize(shape, quant) : 0;
  if (quant != KvQuant::kNone && rows == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_dtype ", KvQuantName(quant), " stores no more tokens per page than the pool's ",
        KvElementName(shape), " pages; ask for a narrower type or the pool's own"));
  }
  if (demote != KvQuant::kNone) {
    const int32_t demoted = PackedBlockSize(shape, demote);
    if (demoted == 0 || (rows > 0 && demoted <= rows)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "demote=", KvQuantName(demote), " stores no more tokens per page than the sequence's ",
          quant != KvQuant::kNone ? KvQuantName(quant) : KvElementName(shape),
          " pages; choose a narrower demote type"));
    }
  }
  return absl::OkStatus();
}

absl::Status KvCache::CheckFormat(const EvictionPolicy* policy, KvQuant quant) const {
  // Device pages have no packed form: to CheckPackedFormats they are the other layout.
  KvShape shape = shape_;
  shape.table_per_layer = shape_.table_per_layer && storage_ == KvStorage::kHost;
  return CheckPackedFormats(shape, policy != nullptr ? policy->demote() : KvQuant::kNone, quant);
}

absl::Status KvCache::InitTables(SequenceKv& seq) const {
  const LayerBudgets rule =
      seq.policy != nullptr ? seq.policy->layer_budgets() : LayerBudgets::kUniform;
  if (rule != LayerBudgets::kUniform && !shape_.table_per_layer) {
    return absl::InvalidArgumentError(absl::StrCat(
        LayerBudgetsName(rule), " layer budgets need a block table per layer (the CPU layout)"));
  }
  seq.layer_budgets.clear();
  seq.layers_measured = false;
  if (rule == LayerBudgets::kPyramid) {
    seq.layer_budgets = LayerBudgetsBeforeRun(rule, seq.budget, shape_.num_layers);
  }
  return CheckFormat(seq.policy, seq.quant);
}

absl::Status KvCache::Reserve(SequenceKv& seq, int32_t num_new) {
  if (seq.tables.empty()) {
    if (absl::Status s = InitTables(seq); !s.ok()) return s;
  }
  const int32_t need = PagesNeeded(seq, num_new);
  if (need > AvailablePages()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV pool has ", AvailablePages(),
                                                     " available pages, sequence needs ", need));
  }
  seq.tables.resize(shape_.NumTables());
  if (seq.DemoteBudget() > 0) {  // MiKV: room for the step's victims in the demoted store
    seq.demoted.resize(shape_.num_layers);
    const int32_t bd = PackedBlockSize(shape_, seq.policy->demote());
    for (int32_t l = 0; l < shape_.num_layers; ++l) {
      KvTable& table = seq.demoted[l];
      const size_t pages =
          static_cast<size_t>((DemotedAfterStep(seq, l, seq.Slots(l) + num_new) + bd - 1) / bd);
      while (table.pages.size() < pages) table.pages.push_back(MustTakePage());
    }
  }
  const int32_t bs = BlockSize(seq);
  for (KvTable& table : seq.tables) {
    const size_t pages = static_cast<size_t>(TablePages(table, num_new, bs));
    while (table.pages.size() < pages) table.pages.push_back(MustTakePage());
  }
  seq.peak_pages = static_cast<int32_t>(std::max<int64_t>(seq.peak_pages, seq.NumPages()));
  return absl::OkStatus();
}

PagedKvHead KvCache::View(const SequenceKv& seq, int32_t layer, int32_t kv_head,
                          int32_t num_slots) {
  CheckHostStorage("View");
  if (seq.quant != KvQuant::kNone) {
    return PackedView(seq.Table(layer), seq.quant, kv_head, num_slots);
  }
  const int64_t bs = shape_.block_size, hd = shape_.head_dim;
  // The (layer, head)'s rows within a page: the page holds only this layer with a table per
  // layer, else every layer.
  const int64_t lh = int64_t(shape_.table_per_layer ? 0 : layer) * shape_.num_kv_heads + kv_head;
  PagedKvHead v;
  v.pages = seq.Table(layer).pages.data();
  v.num_slots = num_slots;
  v.block_size = shape_.block_size;
  v.head_dim = shape_.head_dim;
  v.page_stride = shape_.PageFloats();
  if (shape_.quant != KvQuant::kNone) {
    // Bytes: the (layer, head)'s block is [K data][V data][K scales][V scales].
    v.quant = shape_.quant;
    v.row_bytes = KvQuantDataBytes(shape_.quant, shape_.head_dim);
    v.scale_bytes = KvQuantScaleBytes(shape_.quant, shape_.head_dim);
    v.page_stride = shape_.PageKvBytes();
    uint8_t* block = reinterpret_cast<uint8_t*>(kv_.data()) + lh * bs * shape_.SlotKvBytes();
    v.kq = block;
    v.vq = block + bs * v.row_bytes;
    v.ksc = block + 2 * bs * v.row_bytes;
    v.vsc = v.ksc + bs * v.scale_bytes;
  } else if (shape_.element_bytes == 2) {
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

PagedKvHead KvCache::PackedView(const KvTable& table, KvQuant quant, int32_t kv_head,
                                int32_t num_slots) {
  const int32_t bd = PackedBlockSize(shape_, quant);
  PagedKvHead v;
  v.pages = table.pages.data();
  v.num_slots = num_slots;
  v.block_size = bd;
  v.head_dim = shape_.head_dim;
  v.quant = quant;
  v.row_bytes = KvQuantDataBytes(quant, shape_.head_dim);
  v.scale_bytes = KvQuantScaleBytes(quant, shape_.head_dim);
  v.page_stride = shape_.PageKvBytes();
  // The head's block of the page: [K data][V data][K scales][V scales][pos][score].
  uint8_t* block = reinterpret_cast<uint8_t*>(kv_.data()) +
                   int64_t(kv_head) * bd * PackedSlotBytes(shape_, quant);
  v.kq = block;
  v.vq = block + int64_t(bd) * v.row_bytes;
  v.ksc = block + 2 * int64_t(bd) * v.row_bytes;
  v.vsc = v.ksc + int64_t(bd) * v.scale_bytes;
  v.pos = reinterpret_cast<int32_t*>(v.vsc + int64_t(bd) * v.scale_bytes);
  v.score = reinterpret_cast<float*>(v.pos + bd);
  v.meta_page_stride = shape_.PageKvBytes() / 4;
  return v;
}

PagedKvHead KvCache::DemotedView(const SequenceKv& seq, int32_t layer, int32_t kv_head) {
  CheckHostStorage("DemotedView");
  const KvTable& table = seq.demoted[layer];
  return PackedView(table, seq.policy->demote(), kv_head, table.num_slots);
}

void KvCache::Demote(const SequenceKv& seq, int32_t layer, int32_t kv_head, const PagedKvHead& h,
                     std::span<const int32_t> victims) {
  const PagedKvHead d = DemotedView(seq, layer, kv_head);
  const int32_t have = d.num_slots, incoming = static_cast<int32_t>(victims.size());
  const int32_t after =
      static_cast<int32_t>(std::min<int64_t>(seq.DemoteBudget(), int64_t(have) + incoming));
  // Past the budget, the lowest-ranked of the store and the victims together go (lowest channel
  // first, ties the older position: the order of the importance policies). Candidate c < have
  // is demoted slot c, else victim c - have.
  thread_local std::vector<int32_t> order;
  thread_local std::vector<uint8_t> dropped;
  const int32_t drop = have + incoming - after;
  dropped.assign(have + incoming, 0);
  if (drop > 0) {
    auto score = [&](int32_t c) { return c < have ? d.Score(c) : h.Score(victims[c - have]); };
    auto pos = [&](int32_t c) { return c < have ? d.Pos(c) : h.Pos(victims[c - have]); };
    order.resize(have + incoming);
    for (int32_t c = 0; c < have + incoming; ++c) order[c] = c;
    std::nth_element(order.begin(), order.begin() + (drop - 1), order.end(),
                     [&](int32_t a, int32_t b) {
                       const float sa = score(a), sb = score(b);
                       return sa != sb ? sa < sb : pos(a) < pos(b);
                     });
    for (int32_t i = 0; i < drop; ++i) dropped[order[i]] = 1;
  }
  // Kept victims fill the slots of dropped demoted tokens first, then append.
  thread_local std::vector<float> k, v;
  k.resize(shape_.head_dim);
  v.resize(shape_.head_dim);
  int32_t hole = 0, next = have;
  for (int32_t i = 0; i < incoming; ++i) {
    if (dropped[have + i]) continue;
    while (hole < have && !dropped[hole]) ++hole;
    const int32_t to = hole < have ? hole++ : next++;
    const int32_t from = victims[i];
    h.LoadRow(true, from, k.data());
    h.LoadRow(false, from, v.data());
    d.StoreRows(to, k.data(), v.data());
    d.Pos(to) = h.Pos(from);
    d.Score(to) = h.Score(from);
  }
}

void KvCache::EvictHead(const SequenceKv& seq, int32_t layer, int32_t kv_head, int32_t held,
                        int32_t newest_pos, int32_t num_new) {
  const int32_t bs = BlockSize(seq);
  const int32_t keep = KeptAfterStep(seq, layer, held, bs);
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
  const EvictionStep step{seq.LayerBudget(layer), newest_pos, num_evict, num_new};
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
  if (!seq.demoted.empty()) Demote(seq, layer, kv_head, h, victims);  // MiKV
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

void KvCache::CommitStep(SequenceKv& seq, int32_t num_new) {
  if (!seq.demoted.empty()) {  // before the main tables shrink: it counts their victims
    const int32_t bd = PackedBlockSize(shape_, seq.policy->demote());
    for (int32_t l = 0; l < shape_.num_layers; ++l) {
      seq.demoted[l].num_slots = DemotedAfterStep(seq, l, seq.Slots(l) + num_new);
      FreeUnusedPages(seq.demoted[l], bd);
    }
  }
  for (size_t t = 0; t < seq.tables.size(); ++t) {
    KvTable& table = seq.tables[t];
    const int32_t held = table.num_slots + num_new;
    const int32_t kept = KeptAfterStep(seq, static_cast<int32_t>(t), held, BlockSize(seq));
    ShrinkTable(seq, table, kept, int64_t(held - kept) * shape_.LayersPerPage());
  }
}

void KvCache::ShrinkTable(SequenceKv& seq, KvTable& table, int32_t kept, int64_t evicted) {
  seq.layer_tokens_evicted += evicted;
  seq.tokens_evicted = seq.layer_tokens_evicted / shape_.num_layers;
  table.num_slots = kept;
  FreeUnusedPages(table, BlockSize(seq));
}

void KvCache::Unreserve(SequenceKv& seq) {
  for (KvTable& table : seq.tables) FreeUnusedPages(table, BlockSize(seq));
  for (KvTable& table : seq.demoted) {
    FreeUnusedPages(table, PackedBlockSize(shape_, seq.policy->demote()));
  }
}

void KvCache::Truncate(SequenceKv& seq, int32_t num_slots) {
  // The registered chain may no longer be this sequence's tokens past num_slots.
  if (num_slots < int64_t(seq.prefix_blocks) * shape_.block_size) seq.prefix_closed = true;
  if (num_slots < int64_t(seq.shared.size()) * shape_.block_size) {
    std::fprintf(stderr, "KvCache::Truncate into the %zu shared prefix pages\n", seq.shared.size());
    std::abort();
  }
  for (KvTable& table : seq.tables) {
    if (num_slots < 0 || num_slots > table.num_slots) {
      std::fprintf(stderr, "KvCache::Truncate to %d slots of %d\n", num_slots, table.num_slots);
      std::abort();
    }
    table.num_slots = num_slots;
    FreeUnusedPages(table, BlockSize(seq));
  }
}

void KvCache::FreeUnusedPages(KvTable& table, int32_t block_size) {
  const size_t pages_used = (size_t(table.num_slots) + block_size - 1) / block_size;
  while (table.pages.size() > pages_used) {
    DropPage(table.pages.back());
    table.pages.pop_back();
  }
}

void KvCache::DropPage(int32_t page) {
  uint16_t& refs = page_refs_[size_t(page)];
  if (refs == 0) return alloc_.Free(page);
  if (--refs == 0) --fork_shared_pages_;
}

void KvCache::Release(SequenceKv& seq) {
  for (KvTable& table : seq.tables) {  // the shared pages at its head are the cache's
    for (size_t i = seq.shared.size(); i < table.pages.size(); ++i) DropPage(table.pages[i]);
  }
  for (int32_t id : seq.shared) prefix_->Unpin(id);
  seq.shared.clear();
  for (KvTable& table : seq.demoted) {
    for (int32_t p : table.pages) DropPage(p);
  }
  seq.tables.clear();
  seq.demoted.clear();
  seq.layer_budgets.clear();  // squeeze measures again; Reserve sets pyramid's again
  seq.layers_measured = false;
  seq.layer_similarity.clear();
  seq.similarity_tokens = 0;
  seq.pinned_shift = 0;  // the rotated keys are gone
  seq.prefix_blocks = 0;  // its copies stay cached; it registers (or finds) them again
  seq.prefix_entry = -1;
  seq.prefix_closed = false;
  seq.prefix_grid = true;
}

void KvCache::AddLayerSimilarity(SequenceKv& seq, std::span<const double> sums, int32_t tokens,
                                 int32_t newest_pos) {
  if (seq.layers_measured) return;
  seq.layer_similarity.resize(sums.size(), 0.0);
  for (size_t l = 0; l < sums.size(); ++l) seq.layer_similarity[l] += sums[l];
  seq.similarity_tokens += tokens;
  bool full = false;
  for (const KvTable& t : seq.tables) full |= t.num_slots >= seq.budget;
  if (!full) return;
  std::vector<double> mean(seq.layer_similarity);
  for (double& m : mean) m /= seq.similarity_tokens;
  // A budget whose L-fold total overflows never evicts anyway: it stays uniform.
  std::vector<int32_t> budgets(mean.size(), seq.budget);
  if (int64_t(seq.budget) * static_cast<int64_t>(mean.size()) < INT32_MAX) {
    budgets = SqueezeBudgets(seq.budget, mean);
  }
  SetLayerBudgets(seq, std::move(budgets), newest_pos);
}

void KvCache::SetLayerBudgets(SequenceKv& seq, std::vector<int32_t> budgets, int32_t newest_pos) {
  CheckHostStorage("SetLayerBudgets");
  const bool valid = shape_.table_per_layer && seq.policy != nullptr &&
                     static_cast<int32_t>(budgets.size()) == shape_.num_layers &&
                     static_cast<int32_t>(seq.tables.size()) == shape_.num_layers &&
                     std::all_of(budgets.begin(), budgets.end(), [](int32_t b) { return b >= 1; });
  if (!valid) {
    std::fprintf(stderr, "KvCache::SetLayerBudgets: %zu budgets for %d layers (%zu tables)\n",
                 budgets.size(), shape_.num_layers, seq.tables.size());
    std::abort();
  }
  seq.layer_budgets = std::move(budgets);
  seq.layers_measured = true;
  for (int32_t l = 0; l < shape_.num_layers; ++l) {
    KvTable& table = seq.tables[l];
    const int32_t held = table.num_slots;
    const int32_t kept = KeptAfterStep(seq, l, held, BlockSize(seq));
    if (kept == held) continue;
    for (int32_t h = 0; h < shape_.num_kv_heads; ++h) {
      EvictHead(seq, l, h, held, newest_pos, /*num_new=*/0);
    }
    ShrinkTable(seq, table, kept, held - kept);
  }
}

namespace {

bool SameChannel(const ChannelSpec& a, const ChannelSpec& b) {
  return a.kind == b.kind && a.decay == b.decay && a.window == b.window;
}

const PrefixSnapshot* FindSnapshot(const PrefixEntry& e, const ChannelSpec& spec) {
  for (const PrefixSnapshot& s : e.snapshots) {
    if (SameChannel(s.spec, spec)) return &s;
  }
  return nullptr;
}

}  // namespace

absl::Status KvCache::EnablePrefixCache(const PrefixCacheOptions& options) {
  if (!SupportsPrefixCache()) {
    return absl::FailedPreconditionError(
        "prefix caching needs the CPU layout (host pages, a block table per layer)");
  }
  if (options.chunk_grid <= 0) {
    return absl::InvalidArgumentError("the prefix cache's chunk grid must be positive");
  }
  prefix_options_ = options;
  if (prefix_options_.snapshot_bytes_limit <= 0) {
    prefix_options_.snapshot_bytes_limit =
        shape_.PageBytes() * int64_t(alloc_.num_pages_total()) / 8;
  }
  prefix_ = std::make_unique<PrefixCache>();
  return absl::OkStatus();
}

int32_t KvCache::CachedPages() const {
  return prefix_ != nullptr ? static_cast<int32_t>(prefix_->num_pages()) : 0;
}

int32_t KvCache::SharedCachedPages() const {
  return prefix_ != nullptr ? static_cast<int32_t>(prefix_->pinned_pages()) : 0;
}

int32_t KvCache::AvailablePages() const {
  return alloc_.num_pages_free() + CachedPages() - SharedCachedPages();
}

std::optional<int32_t> KvCache::TakePage() {
  while (alloc_.num_pages_free() == 0) {
    const int32_t victim = prefix_ != nullptr ? prefix_->Victim() : -1;
    if (victim < 0) return std::nullopt;
    std::vector<int32_t> pages = prefix_->Remove(victim);
    for (int32_t p : pages) alloc_.Free(p);
    prefix_stats_.reclaimed_pages += static_cast<int64_t>(pages.size());
  }
  return *alloc_.Allocate();
}

int32_t KvCache::MustTakePage() {
  std::optional<int32_t> page = TakePage();
  if (!page.has_value()) {
    std::fprintf(stderr, "KvCache: no page left after the availability check\n");
    std::abort();
  }
  return *page;
}

void KvCache::CopyPage(int32_t from, int32_t to) {
  const int64_t kv = shape_.PageKvBytes(), meta = shape_.PageMetaEntries();
  uint8_t* base = reinterpret_cast<uint8_t*>(kv_.data());
  std::memcpy(base + to * kv, base + from * kv, static_cast<size_t>(kv));
  std::memcpy(pos_.data() + to * meta, pos_.data() + from * meta, sizeof(int32_t) * meta);
  std::memcpy(score_.data() + to * meta, score_.data() + from * meta, sizeof(float) * meta);
}

PrefixHit KvCache::FindPrefix(const SequenceKv& seq, std::span<const int32_t> prompt) const {
  PrefixHit hit;
  if (prefix_ == nullptr || !seq.prefix_enabled || seq.quant != KvQuant::kNone ||
      !seq.tables.empty()) {
    return hit;
  }
  const int32_t bs = shape_.block_size;
  // Never the last prompt token: one must run to give the logits of the first new token.
  int64_t limit = static_cast<int64_t>(prompt.size()) - 1;
  ChannelSpec channel;
  if (seq.policy != nullptr) {
    // Below the first eviction: every layer still holds all it was given.
    const LayerBudgets rule = seq.policy->layer_budgets();
    if (rule == LayerBudgets::kSqueeze) return hit;  // it measures its layers on every token
    int64_t budget = seq.budget;
    if (rule != LayerBudgets::kUniform) {
      for (int32_t b : LayerBudgetsBeforeRun(rule, seq.budget, shape_.num_layers)) {
        budget = std::min<int64_t>(budget, b);
      }
    }
    limit = std::min(limit, budget);
    channel = seq.policy->channel();
  }
  std::vector<int32_t> chain;
  uint64_t h = seq.prefix_root;
  int32_t parent = -1;
  for (int64_t k = 0; (k + 1) * bs <= limit; ++k) {
    const std::span<const int32_t> block = prompt.subspan(static_cast<size_t>(k * bs), bs);
    h = PrefixCache::Next(h, block);
    const int32_t id = prefix_->Find(h, parent, block);
    if (id < 0) break;
    chain.push_back(id);
    parent = id;
  }
  if (channel.kind != SlotChannel::kNone) {  // up to the last block with this channel's values
    while (!chain.empty() && FindSnapshot(prefix_->entry(chain.back()), channel) == nullptr) {
      chain.pop_back();
    }
  }
  hit.tokens = static_cast<int32_t>(chain.size()) * bs;
  hit.pages = static_cast<int64_t>(chain.size()) * shape_.NumTables();
  // The full cache never writes into a slot it did not append, so it may read the cached pages.
  hit.shares = seq.policy == nullptr;
  for (int32_t id : chain) {
    if (prefix_->entry(id).pins == 0) hit.new_pins += shape_.NumTables();
  }
  hit.entries = std::move(chain);
  return hit;
}

int64_t KvCache::AttachPrefix(SequenceKv& seq, const PrefixHit& hit) {
  if (prefix_ == nullptr || !seq.prefix_enabled) return 0;
  ++prefix_stats_.lookups;
  if (hit.tokens == 0 || !seq.tables.empty() || !InitTables(seq).ok()) return 0;
  const int64_t available = AvailablePages();
  for (int32_t id : hit.entries) prefix_->Pin(id);
  seq.tables.resize(shape_.NumTables());
  for (size_t t = 0; t < seq.tables.size(); ++t) {
    KvTable& table = seq.tables[t];
    for (int32_t id : hit.entries) {
      const int32_t cached = prefix_->entry(id).pages[t];
      if (hit.shares) {
        table.pages.push_back(cached);
        continue;
      }
      const int32_t page = MustTakePage();
      CopyPage(cached, page);
      table.pages.push_back(page);
    }
    table.num_slots = hit.tokens;
  }
  if (hit.shares) seq.shared = hit.entries;  // pinned until Release
  const ChannelSpec channel = seq.policy != nullptr ? seq.policy->channel() : ChannelSpec();
  if (channel.kind != SlotChannel::kNone) {
    // The channel as the producer's prefill left it at hit.tokens (the copies carry the
    // producer's values of a later moment, or of another channel).
    const PrefixSnapshot* snap = FindSnapshot(prefix_->entry(hit.entries.back()), channel);
    const int64_t P = hit.tokens;
    for (int32_t l = 0; l < shape_.num_layers; ++l) {
      for (int32_t h = 0; h < shape_.num_kv_heads; ++h) {
        const PagedKvHead v = View(seq, l, h, hit.tokens);
        const float* src = snap->scores.data() + (int64_t(l) * shape_.num_kv_heads + h) * P;
        for (int32_t s = 0; s < hit.tokens; ++s) v.Score(s) = src[s];
      }
    }
  }
  for (int32_t id : hit.entries) {
    if (!hit.shares) prefix_->Unpin(id);
    prefix_->Touch(id);
  }
  seq.prefix_blocks = static_cast<int32_t>(hit.entries.size());
  seq.prefix_entry = hit.entries.back();
  seq.prefix_hash = prefix_->entry(seq.prefix_entry).hash;
  seq.prefix_grid = hit.tokens % prefix_options_.chunk_grid == 0;
  seq.prefix_closed = false;
  seq.peak_pages = static_cast<int32_t>(std::max<int64_t>(seq.peak_pages, seq.NumPages()));
  ++prefix_stats_.hits;
  prefix_stats_.hit_tokens += hit.tokens;
  return available - AvailablePages();
}

void KvCache::RegisterPrefix(SequenceKv& seq, std::span<const int32_t> prompt,
                             int32_t computed) {
  if (prefix_ == nullptr || !seq.prefix_enabled || seq.prefix_closed ||
      seq.quant != KvQuant::kNone || seq.tables.empty()) {
    return;
  }
  const int32_t bs = shape_.block_size;
  const int64_t prompt_len = static_cast<int64_t>(prompt.size());
  if (computed > prompt_len && int64_t(seq.prefix_blocks) * bs + bs > prompt_len) return;
  for (const KvTable& t : seq.tables) {
    if (t.num_slots != computed) {  // it evicted: slot s no longer holds position s
      seq.prefix_closed = true;
      return;
    }
  }
  if (seq.prefix_blocks == 0) {
    seq.prefix_hash = seq.prefix_root;
    seq.prefix_entry = -1;
  } else if (!prefix_->Holds(seq.prefix_entry, seq.prefix_hash)) {
    seq.prefix_closed = true;  // its chain's tail was reclaimed meanwhile
    return;
  }
  const int64_t blocks = std::min<int64_t>(computed, prompt_len) / bs;
  while (seq.prefix_blocks < blocks) {
    const int64_t k = seq.prefix_blocks;
    const std::span<const int32_t> block = prompt.subspan(static_cast<size_t>(k * bs), bs);
    const uint64_t h = PrefixCache::Next(seq.prefix_hash, block);
    int32_t id = prefix_->Find(h, seq.prefix_entry, block);
    if (id >= 0) {
      prefix_->Touch(id);
    } else {
      // Copies of the sequence's pages; its parent must survive the reclaim that makes room.
      if (seq.prefix_entry >= 0) prefix_->Pin(seq.prefix_entry);
      std::vector<int32_t> pages;
      for (size_t t = 0; t < seq.tables.size(); ++t) {
        std::optional<int32_t> page = TakePage();
        if (!page.has_value()) break;
        pages.push_back(*page);
      }
      if (seq.prefix_entry >= 0) prefix_->Unpin(seq.prefix_entry);
      std::optional<int32_t> inserted;
      if (pages.size() == seq.tables.size()) {
        for (size_t t = 0; t < pages.size(); ++t) CopyPage(seq.tables[t].pages[k], pages[t]);
        inserted = prefix_->Insert(h, seq.prefix_entry, block, pages);
      }
      if (!inserted.has_value()) {  // no room, or the key is another block's
        for (int32_t p : pages) alloc_.Free(p);
        seq.prefix_closed = true;
        return;
      }
      id = *inserted;
      ++prefix_stats_.registered_blocks;
    }
    seq.prefix_entry = id;
    seq.prefix_hash = h;
    ++seq.prefix_blocks;
  }
  if (computed % prefix_options_.chunk_grid != 0) {
    seq.prefix_grid = false;
    return;
  }
  // A snapshot of the channel here: every chunk so far ended on the grid, so a consumer that
  // starts at `computed` and chunks on the grid from there sees what a cold run sees.
  const ChannelSpec channel = seq.policy != nullptr ? seq.policy->channel() : ChannelSpec();
  if (!seq.prefix_grid || channel.kind == SlotChannel::kNone || computed % bs != 0 ||
      computed > prompt_len || int64_t(seq.prefix_blocks) * bs != computed) {
    return;
  }
  const PrefixEntry& e = prefix_->entry(seq.prefix_entry);
  const int64_t n = int64_t(shape_.num_layers) * shape_.num_kv_heads * computed;
  if (FindSnapshot(e, channel) != nullptr ||
      prefix_->snapshot_bytes() + n * int64_t(sizeof(float)) >
          prefix_options_.snapshot_bytes_limit) {
    return;
  }
  PrefixSnapshot snap;
  snap.spec = channel;
  snap.scores.resize(static_cast<size_t>(n));
  for (int32_t l = 0; l < shape_.num_layers; ++l) {
    for (int32_t h = 0; h < shape_.num_kv_heads; ++h) {
      const PagedKvHead v = View(seq, l, h, computed);
      float* dst = snap.scores.data() + (int64_t(l) * shape_.num_kv_heads + h) * computed;
      for (int32_t s = 0; s < computed; ++s) dst[s] = v.Score(s);
    }
  }
  prefix_->AddSnapshot(seq.prefix_entry, std::move(snap));
}

}  // namespace heavykv
