#include "engine/serving/scheduler.h"

#include <algorithm>
#include <climits>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"

namespace heavykv {

Scheduler::Scheduler(KvCache* cache, const SchedulerConfig& config)
    : cache_(cache), config_(config) {}

void Scheduler::Enqueue(Sequence* seq) { waiting_.push_back(seq); }

void Scheduler::Remove(Sequence* seq) {
  running_.erase(std::remove(running_.begin(), running_.end(), seq), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), seq), waiting_.end());
}

int32_t Scheduler::PagesFor(int64_t slots) const {
  const int64_t bs = cache_->shape().block_size;
  return static_cast<int32_t>((slots + bs - 1) / bs);
}

int32_t Scheduler::PagesClamped(int64_t pages) {
  return static_cast<int32_t>(std::min<int64_t>(pages, INT32_MAX));
}

int32_t Scheduler::WorstCasePages(const Sequence& seq) const {
  // Pages it shares with the prefix cache or with other choices of its request are not its own
  // (KvCache::SharedCachedPages and ForkSharedPages count them once for all their holders).
  return PagesClamped(PeakPages(cache_->shape(), seq.bounded() ? seq.kv.policy : nullptr,
                                seq.kv.budget, seq.max_total, seq.kv.quant) -
                      seq.kv.SharedPages() - cache_->ForkSharedPagesOf(seq.kv));
}

int32_t Scheduler::ScratchPages() const {
  return cache_->shape().NumTables() * (PagesFor(config_.max_step_tokens) + 4);
}

bool Scheduler::Fits(int32_t max_total, const EvictionPolicy* policy, int32_t budget,
                     int32_t* need, int32_t* have, KvQuant quant) const {
  const int32_t total = cache_->allocator().num_pages_total();
  const bool bounded = policy != nullptr && budget < max_total;
  *need = PagesClamped(
      PeakPages(cache_->shape(), bounded ? policy : nullptr, budget, max_total, quant));
  // A bounded sequence runs beside the whole scratch reserve, which is held back only while
  // bounded sequences run.
  *have = bounded ? std::max(0, total - ScratchPages()) : total;
  return *need <= *have;
}

int32_t Scheduler::Owed(const Sequence& s) const {
  if (!s.bounded()) return 0;
  return static_cast<int32_t>(std::max<int64_t>(0, WorstCasePages(s) - s.kv.NumPages()));
}

int32_t Scheduler::TotalOwed() const {
  int32_t owed = 0;
  for (const Sequence* s : running_) owed += Owed(*s);
  return owed;
}

void Scheduler::Preempt(Sequence* seq, StepPlan& plan) {
  cache_->Release(seq->kv);
  seq->num_computed = 0;
  ++seq->preemptions;
  running_.erase(std::remove(running_.begin(), running_.end(), seq), running_.end());
  waiting_.push_front(seq);
  plan.preempted.push_back(seq);
}

int32_t Scheduler::num_active() const {
  return static_cast<int32_t>(
      std::count_if(running_.begin(), running_.end(), [](const Sequence* s) { return !s->held; }));
}

bool Scheduler::PreemptHeld(StepPlan& plan, int32_t* free, int32_t* owed) {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    Sequence* s = *it;
    if (!s->held) continue;
    *owed -= Owed(*s);
    const int32_t before = cache_->AvailablePages();
    Preempt(s, plan);
    *free += cache_->AvailablePages() - before;
    return true;
  }
  return false;
}

size_t Scheduler::NextToAdmit() const {
  if (!config_.fair_share) {
    for (size_t i = 0; i < waiting_.size(); ++i) {
      if (!waiting_[i]->held) return i;
    }
    return waiting_.size();
  }
  std::unordered_map<std::string_view, int32_t> running;
  for (const Sequence* s : running_) {
    if (!s->held) ++running[s->client];
  }
  size_t best = waiting_.size();
  int32_t best_running = INT32_MAX;
  for (size_t i = 0; i < waiting_.size(); ++i) {
    if (waiting_[i]->held) continue;
    auto it = running.find(waiting_[i]->client);
    const int32_t n = it == running.end() ? 0 : it->second;
    if (n < best_running) {
      best = i;
      best_running = n;
      if (n == 0) break;
    }
  }
  return best;
}

void Scheduler::PreemptForFairness(StepPlan& plan) {
  if (!config_.fair_share || waiting_.empty() || num_active() < config_.max_running) return;
  const size_t next_index = NextToAdmit();
  if (next_index == waiting_.size()) return;  // every waiting sequence is held
  std::unordered_map<std::string_view, int32_t> running;
  std::unordered_set<std::string_view> clients;
  for (const Sequence* s : running_) {
    if (s->held) continue;
    ++running[s->client];
    clients.insert(s->client);
  }
  for (const Sequence* s : waiting_) {
    if (!s->held) clients.insert(s->client);
  }
  const int32_t share =
      std::max<int32_t>(1, config_.max_running / static_cast<int32_t>(clients.size()));
  const Sequence* next = waiting_[next_index];
  if (running[next->client] >= share) return;
  std::string_view heaviest;
  int32_t most = 0;
  for (const auto& [client, n] : running) {
    if (n > most) {
      heaviest = client;
      most = n;
    }
  }
  if (most <= share) return;
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    if (!(*it)->held && (*it)->client == heaviest) return Preempt(*it, plan);
  }
}

StepPlan Scheduler::Schedule() {
  StepPlan plan;
  // Released sequences over the batch limit wait again (newest first).
  for (int32_t extra = num_active() - config_.max_running; extra > 0; --extra) {
    for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
      if (!(*it)->held) {
        Preempt(*it, plan);
        break;
      }
    }
  }
  PreemptForFairness(plan);
  int32_t tokens_left = config_.max_step_tokens;
  // Not yet promised to this step; cached prefix pages count, an allocation reclaims them.
  int32_t free = cache_->AvailablePages();
  int32_t owed = TotalOwed();                           // still owed to bounded sequences
  // The scratch reserve exists only while bounded sequences run.
  int32_t scratch = AnyBoundedRunning() ? std::min(ScratchPages(), std::max(0, free - owed)) : 0;
  const int32_t max_chunk = std::max(1, config_.prefill_chunk);
  // Prompt chunks end on a fixed grid (multiples of prefill_chunk from position 0) whatever the
  // load, so that a sequence resuming from a cached prefix and a cold run share their chunk
  // ends, and with them their evictions (docs/ARCHITECTURE.md "Prefix caching").
  auto chunk_from = [&](const Sequence* s, int32_t from) {
    return std::min({static_cast<int32_t>(s->tokens.size()) - from, max_chunk - from % max_chunk,
                     tokens_left});
  };
  auto chunk = [&](const Sequence* s) { return chunk_from(s, s->num_computed); };

  // Plans `count` tokens of a bounded sequence, shortened to what its owed pages plus the
  // scratch allow; false when not even one token fits (it waits for the next step).
  auto plan_bounded = [&](Sequence* s, int32_t count) {
    const int32_t own = Owed(*s);
    count = cache_->MaxNewTokens(s->kv, int64_t(own) + scratch, count);
    if (count <= 0) return false;
    const int32_t need = cache_->PagesNeeded(s->kv, count);
    plan.chunks.push_back({s, s->num_computed, count, count == s->pending(), need});
    free -= need;
    owed -= std::min(need, own);
    scratch -= std::max(0, need - own);
    tokens_left -= count;
    plan.num_tokens += count;
    return true;
  };

  // 1. Running sequences, oldest first: a decode token, or the next chunk of their prompt.
  for (size_t i = 0; i < running_.size() && tokens_left > 0;) {
    Sequence* s = running_[i];
    if (s->held) {
      ++i;
      continue;
    }
    const int32_t count = chunk(s);
    if (s->bounded()) {
      plan_bounded(s, count);
      ++i;
      continue;
    }
    const int32_t need = cache_->PagesNeeded(s->kv, count);
    bool self_preempted = false;
    // A running full-cache sequence may grow into the scratch reserve: the reserve only speeds
    // up bounded prefill (their chunks shrink to fit) and must not make it preempt itself.
    while (need > free - owed) {
      // The newest held sequence (held ones have no chunk), else the newest: not planned yet,
      // as we go oldest first.
      size_t v = running_.size() - 1;
      for (size_t j = running_.size(); j-- > 0;) {
        if (running_[j]->held) {
          v = j;
          break;
        }
      }
      Sequence* victim = running_[v];
      owed -= Owed(*victim);
      // What its release makes available: its own pages, and shared pages no one else holds.
      const int32_t before = cache_->AvailablePages();
      Preempt(victim, plan);
      free += cache_->AvailablePages() - before;
      if (victim == s) {
        self_preempted = true;
        break;
      }
      if (v < i) --i;  // s moved down one place
    }
    if (self_preempted) break;
    plan.chunks.push_back({s, s->num_computed, count, count == s->pending(), need});
    free -= need;
    scratch = std::min(scratch, std::max(0, free - owed));
    tokens_left -= count;
    plan.num_tokens += count;
    ++i;
  }

  // 2. Admission, first come first served between the clients with the fewest running sequences:
  // the sequence chosen blocks the others.
  while (!waiting_.empty() && tokens_left > 0) {
    const size_t next = NextToAdmit();
    if (next == waiting_.size()) break;  // only held sequences wait
    if (num_active() >= config_.max_running) break;  // held sequences take no slot
    Sequence* w = waiting_[next];
    // A cached prefix of its prompt, taken at admission (KvCache::AttachPrefix): the cached
    // pages themselves for a full-cache sequence (shared), else private copies, whose sources
    // count in `free` but cannot be reclaimed for them.
    PrefixHit hit = cache_->FindPrefix(w->kv, w->prompt());
    if (w->bounded()) {
      const int32_t worst = WorstCasePages(*w);
      // Room for its worst case beside what is owed, with the whole reserve still free.
      if (hit.tokens > 0 && worst + ScratchPages() > free - owed - hit.pages) hit = PrefixHit();
      if (worst + ScratchPages() > free - owed) {
        if (PreemptHeld(plan, &free, &owed)) continue;
        break;
      }
      waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(next));
      running_.push_back(w);
      plan.admitted.push_back(w);
      free -= static_cast<int32_t>(cache_->AttachPrefix(w->kv, hit));
      w->num_computed = hit.tokens;
      owed += Owed(*w);
      scratch = std::min(ScratchPages(), free - owed);
      if (!plan_bounded(w, chunk(w))) continue;  // admitted; its first chunk waits for scratch
    } else {
      // Its first chunk's pages and the hit's: copies (their sources cannot be reclaimed for
      // them), or, shared, the cached pages it pins that were reclaimable.
      auto need_with = [&](const PrefixHit& h) -> int64_t {
        const int64_t need = cache_->PagesNeeded(w->kv, h.tokens + chunk_from(w, h.tokens));
        return h.shares ? need - h.pages + h.new_pins : need + h.pages;
      };
      if (hit.tokens > 0 && need_with(hit) > free - owed - scratch) hit = PrefixHit();
      if (need_with(hit) > free - owed - scratch) {
        if (PreemptHeld(plan, &free, &owed)) continue;
        break;
      }
      // Pages promised: every running sequence's worst case (owed ones included), the scratch
      // reserve while bounded sequences run, this one's growth, and the shared prefix pages
      // once.
      int64_t promised = WorstCasePages(*w);
      if (hit.shares) promised += hit.new_pins - hit.pages;
      if (OverPromised(promised) && running_.size() > 0) {
        if (PreemptHeld(plan, &free, &owed)) continue;
        break;
      }
      waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(next));
      running_.push_back(w);
      plan.admitted.push_back(w);
      free -= static_cast<int32_t>(cache_->AttachPrefix(w->kv, hit));
      w->num_computed = hit.tokens;
      const int32_t count = chunk(w);
      const int32_t need = cache_->PagesNeeded(w->kv, count);
      plan.chunks.push_back({w, w->num_computed, count, count == w->pending(), need});
      free -= need;
      tokens_left -= count;
      plan.num_tokens += count;
    }
  }
  return plan;
}

bool Scheduler::AnyBoundedRunning() const {
  return std::any_of(running_.begin(), running_.end(),
                     [](const Sequence* s) { return s->bounded(); });
}

bool Scheduler::OverPromised(int64_t more) const {
  // Every running sequence's worst case (owed ones included), the scratch reserve while bounded
  // sequences run, and the pages several hold (the prefix cache's, forks') once.
  int64_t promised = more + cache_->SharedCachedPages() + cache_->ForkSharedPages();
  for (const Sequence* s : running_) promised += WorstCasePages(*s);
  if (AnyBoundedRunning()) promised += ScratchPages();
  return promised > config_.full_overcommit * cache_->allocator().num_pages_total();
}

bool Scheduler::Fork(const Sequence& parent, Sequence* child) {
  const int64_t copies = cache_->ForkPages(parent.kv);
  const int32_t free = cache_->AvailablePages();
  const int32_t owed = TotalOwed();
  const int32_t scratch = child->bounded() || AnyBoundedRunning() ? ScratchPages() : 0;
  bool fits = !parent.held && parent.num_computed == parent.num_prompt &&
              num_active() < config_.max_running && copies <= free - owed - scratch;
  if (fits && child->bounded()) {
    // As admission: its worst case beside what is owed, with the whole reserve still free.
    fits = WorstCasePages(*child) + ScratchPages() <= free - owed;
  } else if (fits) {
    // Its worst case less the pages it will share (all but the copies of partial pages).
    const int64_t worst = WorstCasePages(*child);  // no pages yet: nothing shared to leave out
    fits = !OverPromised(std::min<int64_t>(worst, copies + (worst - parent.kv.NumPages())));
  }
  child->fork_of = parent.id;
  if (fits && cache_->Fork(parent.kv, child->kv).ok()) {
    child->num_computed = parent.num_computed;
    running_.push_back(child);
    return true;
  }
  // It computes the prompt itself once admitted (a preempted sequence's path).
  child->num_computed = 0;
  auto at = waiting_.begin();
  while (at != waiting_.end() && (*at)->fork_of == parent.id) ++at;
  waiting_.insert(at, child);
  return false;
}

absl::Status ApplyPagePlan(const StepPlan& plan, KvCache& cache) {
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& c = plan.chunks[i];
    const int32_t need = cache.PagesNeeded(c.seq->kv, c.count);
    absl::Status s = need == c.new_pages
                         ? cache.Reserve(c.seq->kv, c.count)
                         : absl::InternalError(absl::StrCat("sequence ", c.seq->id, " needs ", need,
                                                            " pages, ", c.new_pages, " planned"));
    if (!s.ok()) {
      // All or nothing: give back what the chunks before it took.
      for (size_t j = 0; j < i; ++j) cache.Unreserve(plan.chunks[j].seq->kv);
      return absl::InternalError(absl::StrCat("applying the step's page plan: ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace heavykv
