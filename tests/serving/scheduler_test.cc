// Scheduler tests: the scheduler is driven directly over a real KvCache (1 layer, 1 kv head,
// head_dim 4, block_size 4) by a simulated engine that runs each StepPlan the way ModelRunner and
// the engine loop do: Reserve every chunk first (all of a step's pages are held at once), then
// Commit each (which trims bounded sequences to their budget), advance num_computed, and append a
// sampled token after a chunk that samples, until the sequence reaches max_total tokens, when its
// pages are released and it is removed.
//
// Every plan is checked against the scheduler's contract: every Reserve succeeds (no overcommit),
// the per-step token limit and max_running hold, chunks continue where the cache left off and
// sample exactly when they reach the last token, the waiting queue is first come first served
// (preempted sequences go back to its head), running sequences are planned before new ones are
// admitted, and preemption only takes the newest running sequences. Random workloads must also
// finish (no starvation or livelock) and leave the pool empty.
#include "engine/serving/scheduler.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "memory/eviction_policy.h"
#include "memory/kv_cache.h"

namespace heavykv {
namespace {

constexpr int32_t kBlock = 4;
constexpr int32_t kToken = 7;  // every prompt and sampled token: the scheduler never looks

KvShape TinyShape() {
  KvShape s;
  s.num_layers = 1;
  s.num_kv_heads = 1;
  s.head_dim = 4;
  s.block_size = kBlock;
  return s;
}

int32_t CeilDiv(int64_t a, int64_t b) { return static_cast<int32_t>((a + b - 1) / b); }

SchedulerConfig Config(int32_t max_step_tokens, int32_t max_running, int32_t prefill_chunk,
                       double full_overcommit = 1.0) {
  SchedulerConfig c;
  c.max_step_tokens = max_step_tokens;
  c.max_running = max_running;
  c.prefill_chunk = prefill_chunk;
  c.full_overcommit = full_overcommit;
  return c;
}

// What one simulated run observed.
struct RunStats {
  int64_t steps = 0;
  int64_t preemptions = 0;
  int32_t max_running = 0;
  int64_t finished = 0;
  int64_t chunks = 0;
  int64_t prefix_hits = 0;      // admissions that took a cached prefix
  int64_t reclaimed_pages = 0;  // cached pages an allocation took back
};

// A pool, a scheduler over it, and the sequences it serves (owned here, as the engine owns them).
class Harness {
 public:
  // Bounded sequences use the window policy at `granularity` with `layers` budgets; with layer
  // budgets other than uniform the pool has 3 layers, a table each.
  // With `prefix_tokens` >= 0 the pool caches prompt prefixes (docs/ARCHITECTURE.md "Prefix
  // caching"), the chunks register their blocks as the engine does, and every prompt's first
  // prefix_tokens tokens are the same (the rest are the sequence's own).
  Harness(int32_t num_pages, const SchedulerConfig& config,
          EvictGranularity granularity = EvictGranularity::kToken,
          LayerBudgets layers = LayerBudgets::kUniform, uint32_t seed = 1,
          int32_t prefix_tokens = -1)
      : cache_(*KvCache::Create(LayerShape(layers, prefix_tokens >= 0), num_pages)),
        window_(*MakePolicy("window", 0.5, granularity, layers)),
        config_(config),
        sched_(cache_.get(), config),
        rng_(seed),
        prefix_tokens_(prefix_tokens) {
    if (prefix_tokens >= 0) {
      PrefixCacheOptions o;
      o.chunk_grid = config.prefill_chunk;
      EXPECT_TRUE(cache_->EnablePrefixCache(o).ok());
    }
  }

  static KvShape LayerShape(LayerBudgets layers, bool prefix = false) {
    KvShape s = TinyShape();
    if (layers != LayerBudgets::kUniform) s.num_layers = 3;
    s.table_per_layer = layers != LayerBudgets::kUniform || prefix;
    return s;
  }

  // A new sequence (not yet enqueued) with `prompt` tokens and room for `max_total`; bounded by
  // the window policy with `budget` when budget > 0.
  Sequence* Add(int32_t prompt, int32_t max_total, int32_t budget = 0) {
    auto s = std::make_unique<Sequence>();
    s->id = static_cast<int64_t>(seqs_.size()) + 1;
    s->tokens.assign(prompt, kToken);
    if (prefix_tokens_ >= 0) {
      for (int32_t i = prefix_tokens_; i < prompt; ++i) s->tokens[i] = 1000 + int32_t(s->id);
      s->kv.prefix_enabled = true;
      s->kv.prefix_root = PrefixCache::Root("");
    }
    s->num_prompt = prompt;
    s->max_total = max_total;
    if (budget > 0) {
      s->kv.policy = window_.get();
      s->kv.budget = budget;
    }
    seqs_.push_back(std::move(s));
    return seqs_.back().get();
  }
  // n choices, between steps: a sequence like `parent` (its prompt, then one token of its own)
  // given to Scheduler::Fork; *running says whether it runs on the parent's pages or waits.
  Sequence* Fork(Sequence* parent, bool* running) {
    Sequence* c = Add(parent->num_prompt, parent->max_total, parent->bounded() ? parent->kv.budget : 0);
    c->tokens.assign(parent->tokens.begin(), parent->tokens.begin() + parent->num_prompt);
    c->tokens.push_back(kToken);
    *running = sched_.Fork(*parent, c);
    return c;
  }
  Sequence* Enqueue(int32_t prompt, int32_t max_total, int32_t budget = 0) {
    Sequence* s = Add(prompt, max_total, budget);
    sched_.Enqueue(s);
    return s;
  }

  // Plans one step, checks the plan against the contract, runs it. Returns the plan (its
  // sequences may have been finished and removed by the time it returns).
  StepPlan Step() {
    const std::vector<Sequence*> running_before = sched_.running();
    const std::vector<Sequence*> waiting_before(sched_.waiting().begin(), sched_.waiting().end());
    std::vector<size_t> sizes_before;
    for (Sequence* s : running_before) sizes_before.push_back(s->tokens.size());

    StepPlan plan = sched_.Schedule();
    ++stats_.steps;
    stats_.preemptions += static_cast<int64_t>(plan.preempted.size());
    stats_.max_running = std::max(stats_.max_running, sched_.num_running());
    CheckPlan(plan, running_before, waiting_before, sizes_before);
    Run(plan);
    CheckBetweenSteps();
    return plan;
  }

  // Plans and runs one step with held sequences about (Sequence::held): only the pages, limits
  // and chunk rules are checked, as the order rules of CheckPlan do not hold for them.
  StepPlan StepHeld() {
    StepPlan plan = sched_.Schedule();
    ++stats_.steps;
    stats_.preemptions += static_cast<int64_t>(plan.preempted.size());
    EXPECT_LE(plan.num_tokens, config_.max_step_tokens);
    EXPECT_LE(sched_.num_active(), config_.max_running);
    std::set<Sequence*> planned;
    for (const ScheduledChunk& c : plan.chunks) {
      EXPECT_FALSE(c.seq->held) << "a chunk for a held sequence";
      EXPECT_TRUE(planned.insert(c.seq).second) << "two chunks for one sequence";
      EXPECT_EQ(c.start, c.seq->num_computed);
      EXPECT_EQ(c.samples, c.start + c.count == static_cast<int32_t>(c.seq->tokens.size()));
    }
    for (Sequence* a : plan.admitted) EXPECT_FALSE(a->held) << "a held sequence was admitted";
    Run(plan);
    CheckBetweenSteps();
    return plan;
  }

  // RunToCompletion with StepHeld.
  bool RunHeldToCompletion(int64_t max_steps) {
    for (int64_t i = 0; i < max_steps; ++i) {
      if (sched_.num_running() == 0 && sched_.num_waiting() == 0) return true;
      StepHeld();
      if (::testing::Test::HasFailure()) return false;
    }
    return sched_.num_running() == 0 && sched_.num_waiting() == 0;
  }

  // Steps until nothing is left (or `max_steps`); true when everything finished.
  bool RunToCompletion(int64_t max_steps) {
    for (int64_t i = 0; i < max_steps; ++i) {
      if (sched_.num_running() == 0 && sched_.num_waiting() == 0) return true;
      Step();
      if (::testing::Test::HasFatalFailure()) return false;
    }
    return sched_.num_running() == 0 && sched_.num_waiting() == 0;
  }

  KvCache& cache() { return *cache_; }
  Scheduler& sched() { return sched_; }
  const RunStats& stats() const { return stats_; }
  const SchedulerConfig& config() const { return config_; }
  const std::vector<std::unique_ptr<Sequence>>& seqs() const { return seqs_; }
  const EvictionPolicy* window() const { return window_.get(); }

 private:
  void CheckPlan(const StepPlan& plan, const std::vector<Sequence*>& running_before,
                 const std::vector<Sequence*>& waiting_before,
                 const std::vector<size_t>& sizes_before) {
    // (2) The step's token limit and the running limit.
    int32_t sum = 0;
    for (const ScheduledChunk& c : plan.chunks) sum += c.count;
    EXPECT_EQ(plan.num_tokens, sum);
    EXPECT_LE(plan.num_tokens, config_.max_step_tokens);
    EXPECT_LE(sched_.num_running(), config_.max_running);

    // Preemption takes the newest running sequences, newest first, and only when a full-cache
    // sequence is running (bounded ones never outgrow what they were promised).
    ASSERT_LE(plan.preempted.size(), running_before.size());
    for (size_t k = 0; k < plan.preempted.size(); ++k) {
      Sequence* v = plan.preempted[k];
      EXPECT_EQ(v, running_before[running_before.size() - 1 - k]) << "victim " << k;
      EXPECT_GE(v->preemptions, 1);
      EXPECT_EQ(v->tokens.size(),
                sizes_before[running_before.size() - 1 - k]);  // nothing is lost
    }
    if (!plan.preempted.empty()) {
      EXPECT_TRUE(std::any_of(running_before.begin(), running_before.end(), [](Sequence* s) {
        return !s->bounded();
      })) << "a preemption with only bounded sequences running";
    }
    const std::set<Sequence*> preempted(plan.preempted.begin(), plan.preempted.end());
    const std::set<Sequence*> readmitted(plan.admitted.begin(), plan.admitted.end());
    for (Sequence* v : plan.preempted) {
      // Released, to be recomputed from its first token (unless readmitted this very step, when
      // its first chunk is already planned from 0, or from the cached prefix it took then:
      // whole blocks of its prompt).
      if (readmitted.count(v) && v->num_computed > 0) {
        EXPECT_EQ(v->num_computed % kBlock, 0);
        EXPECT_LT(v->num_computed, v->num_prompt);
        EXPECT_EQ(v->kv.Slots(0), v->num_computed);
        continue;
      }
      EXPECT_EQ(v->num_computed, 0);
      EXPECT_TRUE(v->kv.tables.empty());
      EXPECT_EQ(v->kv.NumPages(), 0);
    }

    // (3) FCFS: admitted ++ waiting_after == reversed(preempted) ++ waiting_before.
    std::vector<Sequence*> queue_before(plan.preempted.rbegin(), plan.preempted.rend());
    queue_before.insert(queue_before.end(), waiting_before.begin(), waiting_before.end());
    std::vector<Sequence*> queue_after = plan.admitted;
    queue_after.insert(queue_after.end(), sched_.waiting().begin(), sched_.waiting().end());
    EXPECT_EQ(queue_after, queue_before) << "the waiting queue is not first come first served";
    // Running: the survivors in their order, then the admitted.
    std::vector<Sequence*> survivors;
    for (Sequence* s : running_before) {
      if (!preempted.count(s)) survivors.push_back(s);
    }
    std::vector<Sequence*> expected_running = survivors;
    expected_running.insert(expected_running.end(), plan.admitted.begin(), plan.admitted.end());
    EXPECT_EQ(sched_.running(), expected_running);
    // Arrival order everywhere: running oldest first, all of them older than every waiting one.
    int64_t last = 0;
    for (Sequence* s : sched_.running()) {
      EXPECT_GT(s->id, last) << "running out of arrival order";
      last = s->id;
    }
    for (Sequence* s : sched_.waiting()) {
      EXPECT_GT(s->id, last) << "waiting out of arrival order";
      last = s->id;
    }

    // Chunks: one per sequence, each continuing where the cache left off, within the prefill
    // chunk, sampling exactly when it reaches the last known token.
    std::set<Sequence*> planned;
    const std::set<Sequence*> running_now(sched_.running().begin(), sched_.running().end());
    for (const ScheduledChunk& c : plan.chunks) {
      ASSERT_NE(c.seq, nullptr);
      EXPECT_TRUE(planned.insert(c.seq).second) << "two chunks for one sequence";
      EXPECT_TRUE(running_now.count(c.seq)) << "a chunk for a sequence that is not running";
      EXPECT_EQ(c.start, c.seq->num_computed);
      EXPECT_GE(c.count, 1);
      EXPECT_LE(c.count, config_.prefill_chunk);
      EXPECT_LE(c.start + c.count, static_cast<int32_t>(c.seq->tokens.size()));
      EXPECT_EQ(c.samples, c.start + c.count == static_cast<int32_t>(c.seq->tokens.size()));
    }
    // (4) Running sequences first, in their order; then the admitted ones. A survivor gets no
    // chunk only when the step's tokens ran out, and then nothing is admitted.
    size_t ci = 0;
    bool gap = false;
    for (Sequence* s : survivors) {
      if (ci < plan.chunks.size() && plan.chunks[ci].seq == s) {
        EXPECT_FALSE(gap) << "a running sequence was skipped before a later one";
        ++ci;
      } else {
        gap = true;
      }
    }
    if (gap) {
      EXPECT_EQ(plan.num_tokens, config_.max_step_tokens)
          << "a running sequence got no chunk though the step had tokens left";
      EXPECT_TRUE(plan.admitted.empty()) << "admitted while a running sequence waited";
    }
    const std::set<Sequence*> admitted(plan.admitted.begin(), plan.admitted.end());
    for (; ci < plan.chunks.size(); ++ci) {
      EXPECT_TRUE(admitted.count(plan.chunks[ci].seq))
          << "a chunk after the admitted ones is not for an admitted sequence";
    }
  }

  void Run(const StepPlan& plan) {
    // (1) The pages the scheduler promised: the plan names each chunk's new pages, and applying
    // it allocates exactly those, all of the step's chunks at once.
    std::vector<int64_t> pages_before;
    for (const ScheduledChunk& c : plan.chunks) pages_before.push_back(c.seq->kv.NumPages());
    const int32_t free = cache_->allocator().num_pages_free();
    absl::Status applied = ApplyPagePlan(plan, *cache_);
    ASSERT_TRUE(applied.ok()) << "overcommit at step " << stats_.steps << ", " << free
                              << " pages free: " << applied;
    for (size_t i = 0; i < plan.chunks.size(); ++i) {
      const ScheduledChunk& c = plan.chunks[i];
      EXPECT_EQ(c.seq->kv.NumPages() - pages_before[i], c.new_pages)
          << "seq " << c.seq->id << " chunk " << c.start << "+" << c.count;
      if (c.seq->bounded() && c.count == 1) {  // a decode step stays within the worst case
        EXPECT_LE(c.seq->kv.NumPages(), sched_.WorstCasePages(*c.seq));
      }
    }
    for (const ScheduledChunk& c : plan.chunks) {
      Sequence& s = *c.seq;
      cache_->CommitStep(s.kv, c.count);
      if (s.kv.policy != nullptr && s.kv.policy->layer_budgets() == LayerBudgets::kSqueeze &&
          !s.kv.layers_measured) {
        // As the runner does after a squeeze sequence's first step: per-layer budgets summing
        // to L x budget (here random, any split admission must hold), applied at once.
        SetRandomLayerBudgets(s);
      }
      s.num_computed += c.count;
      cache_->RegisterPrefix(s.kv, s.prompt(), s.num_computed);
      ++stats_.chunks;
      if (!c.samples) continue;
      s.tokens.push_back(kToken);
      if (static_cast<int32_t>(s.tokens.size()) >= s.max_total) {
        cache_->Release(s.kv);
        sched_.Remove(&s);
        ++stats_.finished;
      }
    }
  }

  void SetRandomLayerBudgets(Sequence& s) {
    const int32_t L = cache_->shape().num_layers;
    std::vector<int32_t> budgets(L, 1);
    for (int64_t left = int64_t(L) * (s.kv.budget - 1); left > 0; --left) ++budgets[rng_() % L];
    cache_->SetLayerBudgets(s.kv, budgets, s.num_computed + s.pending() - 1);
    EXPECT_EQ(s.kv.layer_budgets, budgets);
  }

  void CheckBetweenSteps() {
    // The sequences' own pages; those shared with the prefix cache are its, and those several
    // choices hold (KvCache::Fork) count once.
    int32_t held = cache_->ForkSharedPages();
    for (Sequence* s : sched_.running()) {
      held += static_cast<int32_t>(s->kv.NumPages() - s->kv.SharedPages() -
                                   cache_->ForkSharedPagesOf(s->kv));
      for (int32_t l = 0; l < cache_->shape().num_layers && !s->kv.tables.empty(); ++l) {
        EXPECT_EQ(static_cast<int32_t>(s->kv.Table(l).pages.size()),
                  CeilDiv(s->kv.Slots(l), kBlock));
        if (s->bounded()) {  // a page granularity head stays under a page over its budget
          EXPECT_LE(s->kv.Slots(l),
                    s->kv.LayerBudget(l) + (window_->page_granularity() ? kBlock - 1 : 0));
        } else {
          EXPECT_EQ(s->kv.Slots(l), s->num_computed);
        }
      }
      if (s->bounded()) {
        EXPECT_LE(s->kv.NumPages(), sched_.WorstCasePages(*s));
      }
    }
    for (Sequence* s : sched_.waiting()) {
      EXPECT_TRUE(s->kv.tables.empty()) << "a waiting sequence holds pages";
      EXPECT_EQ(s->num_computed, 0);
    }
    EXPECT_EQ(cache_->allocator().num_pages_used(), held + cache_->CachedPages())
        << "pages leaked";
    if (cache_->prefix_cache() != nullptr) {
      EXPECT_TRUE(cache_->prefix_cache()->CheckInvariants());
    }
  }

  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<EvictionPolicy> window_;
  SchedulerConfig config_;
  Scheduler sched_;
  std::vector<std::unique_ptr<Sequence>> seqs_;
  RunStats stats_;
  std::mt19937 rng_;
  int32_t prefix_tokens_ = -1;
};

// ---------------------------------------------------------------------------------------------
// Sizes.

TEST(SchedulerTest, WorstCaseAndScratchPages) {
  Harness h(32, Config(/*max_step_tokens=*/13, 8, 8));
  EXPECT_EQ(h.sched().ScratchPages(), CeilDiv(13, kBlock) + 4);
  Sequence* full = h.Add(5, 17);
  EXPECT_FALSE(full->bounded());
  EXPECT_EQ(h.sched().WorstCasePages(*full), CeilDiv(17, kBlock));
  Sequence* bounded = h.Add(5, 100, /*budget=*/8);
  EXPECT_TRUE(bounded->bounded());
  EXPECT_EQ(h.sched().WorstCasePages(*bounded), CeilDiv(9, kBlock));  // budget + 1 slots
  // A budget at or above the maximum length bounds nothing: a full-cache sequence.
  Sequence* roomy = h.Add(5, 20, /*budget=*/20);
  EXPECT_FALSE(roomy->bounded());
  EXPECT_EQ(h.sched().WorstCasePages(*roomy), CeilDiv(20, kBlock));
  Sequence* tight = h.Add(5, 20, /*budget=*/19);
  EXPECT_TRUE(tight->bounded());
  EXPECT_EQ(h.sched().WorstCasePages(*tight), CeilDiv(20, kBlock));
}

// Page granularity: a head may hold up to a page over its budget, so the worst case and Fits()
// count ceil((budget + block) / block) pages instead of ceil((budget + 1) / block).
TEST(SchedulerTest, PageGranularityIsOwedAPageMore) {
  Harness token(64, Config(16, 8, 8));
  Harness page(64, Config(16, 8, 8), EvictGranularity::kPage);
  EXPECT_EQ(token.sched().WorstCasePages(*token.Add(5, 100, /*budget=*/10)), CeilDiv(11, kBlock));
  EXPECT_EQ(page.sched().WorstCasePages(*page.Add(5, 100, /*budget=*/10)), CeilDiv(14, kBlock));
  int32_t need = -1, have = -1;
  EXPECT_TRUE(page.sched().Fits(100000, page.window(), 10, &need, &have));
  EXPECT_EQ(need, CeilDiv(14, kBlock));
  // Never more than the sequence's own length.
  EXPECT_EQ(page.sched().WorstCasePages(*page.Add(5, 12, /*budget=*/10)), CeilDiv(12, kBlock));
}

// (7) Fits(): full sequences against the whole pool, bounded ones beside the scratch reserve.
TEST(SchedulerTest, FitsRefusesWhatCouldNeverRunAlone) {
  Harness h(20, Config(/*max_step_tokens=*/16, 8, 8));  // scratch = 4 + 4 = 8 pages
  ASSERT_EQ(h.sched().ScratchPages(), 8);
  int32_t need = -1, have = -1;
  EXPECT_TRUE(h.sched().Fits(80, /*policy=*/nullptr, 0, &need, &have));
  EXPECT_EQ(need, 20);
  EXPECT_EQ(have, 20);
  EXPECT_FALSE(h.sched().Fits(81, nullptr, 0, &need, &have));
  EXPECT_EQ(need, 21);
  EXPECT_EQ(have, 20);
  // Bounded: its worst case plus the scratch reserve must fit.
  EXPECT_TRUE(h.sched().Fits(100000, h.window(), /*budget=*/47, &need, &have));
  EXPECT_EQ(need, 12);
  EXPECT_EQ(have, 12);
  EXPECT_FALSE(h.sched().Fits(100000, h.window(), 48, &need, &have));
  EXPECT_EQ(need, 13);
  EXPECT_EQ(have, 12);
  // A long bounded sequence fits where the same length with a full cache does not.
  EXPECT_FALSE(h.sched().Fits(100000, nullptr, 0, &need, &have));
  // A pool smaller than the reserve fits no bounded sequence.
  Harness tiny(6, Config(16, 8, 8));
  EXPECT_FALSE(tiny.sched().Fits(100, tiny.window(), 1, &need, &have));
  EXPECT_EQ(have, 0);
}

// What Fits() accepts actually runs to completion alone; the largest of each kind.
TEST(SchedulerTest, LargestSequencesThatFitRunAlone) {
  {
    Harness h(20, Config(16, 8, 8));
    int32_t need, have;
    ASSERT_TRUE(h.sched().Fits(80, nullptr, 0, &need, &have));
    h.Enqueue(50, 80);
    ASSERT_TRUE(h.RunToCompletion(1000));
    EXPECT_EQ(h.stats().finished, 1);
    EXPECT_EQ(h.stats().preemptions, 0);
  }
  {
    Harness h(20, Config(16, 8, 8));
    int32_t need, have;
    ASSERT_TRUE(h.sched().Fits(300, h.window(), 47, &need, &have));
    h.Enqueue(120, 300, 47);
    ASSERT_TRUE(h.RunToCompletion(1000));
    EXPECT_EQ(h.stats().finished, 1);
    EXPECT_EQ(h.cache().allocator().num_pages_used(), 0);
  }
}

// ---------------------------------------------------------------------------------------------
// Planning rules.

// (4) Prefill goes in chunks of prefill_chunk; the last one samples.
TEST(SchedulerTest, PrefillIsChunked) {
  Harness h(64, Config(/*max_step_tokens=*/64, 8, /*prefill_chunk=*/4));
  Sequence* s = h.Enqueue(10, 20);
  const std::vector<std::pair<int32_t, int32_t>> expected = {{0, 4}, {4, 4}, {8, 2}};
  for (size_t i = 0; i < expected.size(); ++i) {
    StepPlan plan = h.Step();
    ASSERT_EQ(plan.chunks.size(), 1u);
    EXPECT_EQ(plan.chunks[0].seq, s);
    EXPECT_EQ(plan.chunks[0].start, expected[i].first);
    EXPECT_EQ(plan.chunks[0].count, expected[i].second);
    EXPECT_EQ(plan.chunks[0].samples, i + 1 == expected.size());
    EXPECT_EQ(plan.admitted.size(), i == 0 ? 1u : 0u);
  }
  StepPlan plan = h.Step();  // then one decode token per step
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].start, 11 - 1);
  EXPECT_EQ(plan.chunks[0].count, 1);
  EXPECT_TRUE(plan.chunks[0].samples);
}

// Applying a plan the cache cannot honour (a page count the scheduler did not plan) changes
// nothing and is INTERNAL: a broken invariant, not a pool-exhaustion the engine would retry.
TEST(SchedulerTest, ApplyPagePlanIsAllOrNothing) {
  Harness h(64, Config(/*max_step_tokens=*/64, 8, /*prefill_chunk=*/64));
  Sequence* a = h.Add(20, 40);
  Sequence* b = h.Add(20, 40);
  StepPlan plan;
  plan.chunks.push_back({a, 0, 20, true, 5});  // 20 slots of 4-token pages: 5 pages
  plan.chunks.push_back({b, 0, 20, true, 4});  // planned wrong
  const int32_t free = h.cache().allocator().num_pages_free();
  absl::Status s = ApplyPagePlan(plan, h.cache());
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_EQ(h.cache().allocator().num_pages_free(), free);
  EXPECT_EQ(a->kv.NumPages(), 0);
  plan.chunks[1].new_pages = 5;
  ASSERT_TRUE(ApplyPagePlan(plan, h.cache()).ok());
  EXPECT_EQ(h.cache().allocator().num_pages_free(), free - 10);
  h.cache().Release(a->kv);
  h.cache().Release(b->kv);
}

// (4) Running sequences' decode tokens come first; a new prompt takes what is left.
TEST(SchedulerTest, DecodeTokensComeBeforeAdmission) {
  Harness h(64, Config(/*max_step_tokens=*/6, 8, /*prefill_chunk=*/8));
  Sequence* a = h.Enqueue(3, 30);
  Sequence* b = h.Enqueue(2, 30);
  StepPlan p0 = h.Step();  // both prompts fit: 3 + 2 tokens
  ASSERT_EQ(p0.chunks.size(), 2u);
  EXPECT_EQ(p0.chunks[0].seq, a);
  EXPECT_EQ(p0.chunks[1].seq, b);
  Sequence* c = h.Enqueue(20, 40);
  StepPlan p1 = h.Step();
  ASSERT_EQ(p1.chunks.size(), 3u);
  EXPECT_EQ(p1.chunks[0].seq, a);
  EXPECT_EQ(p1.chunks[0].count, 1);
  EXPECT_EQ(p1.chunks[1].seq, b);
  EXPECT_EQ(p1.chunks[1].count, 1);
  EXPECT_EQ(p1.chunks[2].seq, c);
  EXPECT_EQ(p1.chunks[2].count, 4);  // 6 - 2 decode tokens
  EXPECT_FALSE(p1.chunks[2].samples);
  ASSERT_EQ(p1.admitted.size(), 1u);
  EXPECT_EQ(p1.admitted[0], c);
  // Its prefill continues after the decodes of the older ones.
  StepPlan p2 = h.Step();
  ASSERT_EQ(p2.chunks.size(), 3u);
  EXPECT_EQ(p2.chunks[2].seq, c);
  EXPECT_EQ(p2.chunks[2].start, 4);
  EXPECT_EQ(p2.chunks[2].count, 4);
}

// (2) The step's token limit holds, and a sequence that got nothing is next to go.
TEST(SchedulerTest, TokenLimitPerStep) {
  Harness h(128, Config(/*max_step_tokens=*/3, 16, /*prefill_chunk=*/2));
  for (int i = 0; i < 6; ++i) h.Enqueue(1 + i, 20);
  for (int i = 0; i < 40; ++i) {
    StepPlan plan = h.Step();
    EXPECT_LE(plan.num_tokens, 3);
  }
  ASSERT_TRUE(h.RunToCompletion(2000));
  EXPECT_EQ(h.stats().finished, 6);
}

// (2) max_running bounds the running set; the next waits until one finishes.
TEST(SchedulerTest, MaxRunning) {
  Harness h(128, Config(64, /*max_running=*/2, 16));
  Sequence* a = h.Enqueue(2, 4);
  Sequence* b = h.Enqueue(2, 8);
  Sequence* c = h.Enqueue(2, 8);
  StepPlan p0 = h.Step();
  EXPECT_EQ(p0.admitted, (std::vector<Sequence*>{a, b}));
  EXPECT_EQ(h.sched().num_waiting(), 1);
  h.Step();  // a: 4th token sampled, finishes
  EXPECT_EQ(h.stats().finished, 1);
  StepPlan p2 = h.Step();
  EXPECT_EQ(p2.admitted, (std::vector<Sequence*>{c}));
  ASSERT_TRUE(h.RunToCompletion(100));
  EXPECT_EQ(h.stats().max_running, 2);
}

// (3) The head of the queue blocks those behind it, even when they would fit.
TEST(SchedulerTest, HeadOfQueueBlocksSmallerLaterRequests) {
  // 10 pages; `big` needs 8 pages at most, so with overcommit 1 it waits while `first` (4 pages
  // at most) runs, and `small` (1 page) must wait behind it.
  Harness h(10, Config(64, 8, 64));
  Sequence* first = h.Enqueue(4, 16);
  h.Step();
  Sequence* big = h.Enqueue(4, 32);
  Sequence* small = h.Enqueue(1, 2);
  StepPlan p = h.Step();
  EXPECT_TRUE(p.admitted.empty());
  EXPECT_EQ(h.sched().waiting().front(), big);
  EXPECT_EQ(h.sched().waiting().back(), small);
  // Once `first` finishes, `big` goes first.
  std::vector<Sequence*> admission_order;
  while (h.sched().num_running() + h.sched().num_waiting() > 0) {
    StepPlan q = h.Step();
    admission_order.insert(admission_order.end(), q.admitted.begin(), q.admitted.end());
    ASSERT_LT(h.stats().steps, 500);
  }
  ASSERT_EQ(admission_order.size(), 2u);
  EXPECT_EQ(admission_order[0], big);
  EXPECT_EQ(admission_order[1], small);
  EXPECT_EQ(first->kv.NumPages(), 0);
}

// ---------------------------------------------------------------------------------------------
// Preemption.

// (5) Overcommitted full-cache sequences that outgrow the pool: the newest is preempted, goes to
// the head of the queue with its pages released, and is recomputed from all its tokens.
TEST(SchedulerTest, NewestFullSequenceIsPreemptedAndRecomputed) {
  // 12 pages = 48 slots; each sequence grows to 8 + 28 = 36 tokens = 9 pages.
  Harness h(12, Config(64, 8, 64, /*full_overcommit=*/4.0));
  Sequence* a = h.Enqueue(8, 36);
  Sequence* b = h.Enqueue(8, 36);
  Sequence* c = h.Enqueue(8, 36);
  StepPlan p0 = h.Step();
  ASSERT_EQ(p0.admitted.size(), 3u);
  bool saw = false;
  for (int i = 0; i < 200 && !saw; ++i) {
    const size_t c_tokens = c->tokens.size();
    const int32_t c_pages = static_cast<int32_t>(c->kv.NumPages());
    const std::vector<Sequence*> running = h.sched().running();
    const bool c_running = std::find(running.begin(), running.end(), c) != running.end();
    StepPlan p = h.Step();
    if (p.preempted.empty()) continue;
    saw = true;
    // The first victim is the newest running one: c.
    ASSERT_TRUE(c_running);
    EXPECT_EQ(p.preempted[0], c);
    EXPECT_EQ(c->preemptions, 1);
    EXPECT_EQ(c->tokens.size(), c_tokens);
    EXPECT_EQ(a->preemptions, 0);  // the oldest is never the victim while others run
    EXPECT_GT(c_pages, 0);         // and now holds none (checked with every plan)
    if (p.preempted.size() > 1) {
      EXPECT_EQ(p.preempted[1], b);
    }
  }
  ASSERT_TRUE(saw) << "the workload never outgrew the pool";
  // c is at the head of the queue (or b, preempted after it, is), released, and recomputed.
  ASSERT_GT(h.sched().num_waiting(), 0);
  Sequence* head = h.sched().waiting().front();
  EXPECT_TRUE(head == b || head == c);
  EXPECT_EQ(c->num_computed, 0);
  EXPECT_EQ(c->kv.NumPages(), 0);
  // When c runs again, it starts at token 0 and samples only after all its tokens.
  const size_t c_tokens = c->tokens.size();
  int32_t recomputed = 0;
  bool sampled = false;
  for (int i = 0; i < 2000 && !sampled; ++i) {
    StepPlan p = h.Step();
    for (const ScheduledChunk& ch : p.chunks) {
      if (ch.seq != c) continue;
      EXPECT_EQ(ch.start, recomputed);  // from token 0 on
      recomputed += ch.count;
      if (ch.samples) sampled = true;
    }
    if (c->preemptions > 1) break;  // preempted again before it sampled: fine, stop here
  }
  if (c->preemptions == 1) {
    EXPECT_TRUE(sampled);
    EXPECT_EQ(recomputed, static_cast<int32_t>(c_tokens));
  }
  ASSERT_TRUE(h.RunToCompletion(5000));
  EXPECT_EQ(h.stats().finished, 3);
  EXPECT_EQ(h.cache().allocator().num_pages_used(), 0);
}

// With the default overcommit of 1, full-cache sequences wait instead of being preempted.
TEST(SchedulerTest, NoOvercommitNoPreemption) {
  Harness h(12, Config(64, 8, 64));
  for (int i = 0; i < 5; ++i) h.Enqueue(8, 36);
  ASSERT_TRUE(h.RunToCompletion(5000));
  EXPECT_EQ(h.stats().finished, 5);
  EXPECT_EQ(h.stats().preemptions, 0);
  EXPECT_EQ(h.stats().max_running, 1);  // 9 pages each in a 12-page pool
}

// (5) + (6) Bounded sequences are never preempted among themselves, and far more of them run at
// once than full-cache sequences of the same length fit.
TEST(SchedulerTest, BoundedSequencesRunManyAtOnceWithoutPreemption) {
  // 40 pages. A full sequence of 40 tokens needs 10 pages: 4 at once. Budget 4 needs 2 pages
  // (budget + 1 slots) beside the 8-page scratch reserve: up to 16 at once.
  const SchedulerConfig cfg = Config(/*max_step_tokens=*/16, 64, 8);
  Harness bounded(40, cfg);
  Harness full(40, cfg);
  for (int i = 0; i < 20; ++i) {
    bounded.Enqueue(8, 40, /*budget=*/4);
    full.Enqueue(8, 40);
  }
  ASSERT_TRUE(bounded.RunToCompletion(10000));
  ASSERT_TRUE(full.RunToCompletion(10000));
  EXPECT_EQ(bounded.stats().finished, 20);
  EXPECT_EQ(full.stats().finished, 20);
  EXPECT_EQ(bounded.stats().preemptions, 0);
  EXPECT_LE(full.stats().max_running, 4);
  EXPECT_GE(bounded.stats().max_running, 12);
  EXPECT_GE(bounded.stats().max_running, 3 * full.stats().max_running);
  EXPECT_LT(bounded.stats().steps, full.stats().steps);
}

// Full-cache sequences share a cached prompt prefix's pages (read only) instead of each holding
// a copy: admission counts those pages once, so several times more of them run at once. 40
// pages; a 32-token prompt + 4 new = 9 pages each: 4 at once without the cache; with it, 7 of
// their pages are the shared prefix (28 tokens, never the last prompt token), 2 their own.
TEST(SchedulerTest, SharedPrefixPagesLetMoreFullSequencesRun) {
  const SchedulerConfig cfg = Config(/*max_step_tokens=*/64, 64, /*prefill_chunk=*/32);
  Harness plain(40, cfg), cached(40, cfg, EvictGranularity::kToken, LayerBudgets::kUniform, 1,
                                 /*prefix_tokens=*/32);
  cached.Enqueue(32, 36);  // sends the prompt first
  ASSERT_TRUE(cached.RunToCompletion(100));
  EXPECT_EQ(cached.cache().CachedPages(), 8);  // its 8 whole prompt blocks
  for (int i = 0; i < 12; ++i) {
    plain.Enqueue(32, 36);
    cached.Enqueue(32, 36);
  }
  ASSERT_TRUE(plain.RunToCompletion(10000));
  ASSERT_TRUE(cached.RunToCompletion(10000));
  EXPECT_EQ(plain.stats().max_running, 4);
  EXPECT_GE(cached.stats().max_running, 12);
  EXPECT_EQ(cached.stats().preemptions, 0);
  EXPECT_EQ(cached.cache().prefix_stats().hits, 12);
  EXPECT_EQ(cached.cache().prefix_stats().hit_tokens, 12 * 28);
  EXPECT_EQ(cached.cache().SharedCachedPages(), 0);
}

// Regression (fixed in 6d8f40c): a full-cache sequence that needed pages preempted victims while
// still keeping the scratch reserve computed at the start of the step, even after the last
// bounded sequence was gone, and then preempted itself although the pool had room for it. Here
// (17 pages, scratch 8) F (full, 15 pages at most) ran with B (bounded, 1 page); at 8 pages F
// needed 2 more with 9 free, preempted B and then itself (2 > 10 - 0 - 8); both were readmitted
// on their first chunks and the cycle repeated every 4 steps: F never got past 8 pages, and B,
// recomputed each cycle, stopped gaining tokens at 33: a livelock. Expected: F never preempts
// itself here and both finish.
TEST(SchedulerTest, FullSequenceIsNotPreemptedForAScratchReserveNobodyNeeds) {
  Harness h(17, Config(/*max_step_tokens=*/16, 8, /*prefill_chunk=*/8));
  ASSERT_EQ(h.sched().ScratchPages(), 8);
  int32_t need, have;
  ASSERT_TRUE(h.sched().Fits(60, /*policy=*/nullptr, 0, &need, &have));
  ASSERT_TRUE(h.sched().Fits(200, h.window(), 3, &need, &have));
  Sequence* f = h.Enqueue(56, 60);
  Sequence* b = h.Enqueue(8, 200, /*budget=*/3);
  for (int i = 0; i < 2000 && f->preemptions == 0 && b->preemptions == 0; ++i) {
    const int32_t f_pages = static_cast<int32_t>(f->kv.NumPages());
    const int32_t free_pages = h.cache().allocator().num_pages_free();
    const int32_t b_pages = static_cast<int32_t>(b->kv.NumPages());
    h.Step();
    if (f->preemptions > 0) {
      ADD_FAILURE() << "the full-cache sequence preempted itself at step " << h.stats().steps
                    << " holding " << f_pages << " pages with " << free_pages
                    << " free and the bounded one holding " << b_pages << " (pool 17)";
    }
  }
  EXPECT_TRUE(h.RunToCompletion(20000))
      << "livelock: " << h.stats().preemptions << " preemptions, F has " << f->tokens.size() << "/"
      << f->max_total << " tokens, B " << b->tokens.size() << "/" << b->max_total;
  EXPECT_EQ(h.stats().finished, 2);
}

// Doc/behaviour mismatch (engine/serving/scheduler.h, SchedulerConfig::full_overcommit: "1 never
// preempts"): the admission check for a full-cache sequence sums only the worst cases of the
// full-cache sequences running, not the pages held by or owed to running bounded sequences. Here
// (20 pages) B (bounded, 1 page, older) runs and F (full, 20 pages at most) is admitted on its
// first chunk with the default overcommit of 1; F can never hold all 20 pages beside B's page, so
// as the newest it preempts itself when it reaches the limit and is recomputed, again and again
// until B ends (14 preemptions): the thrash that overcommit 1 is meant to rule out. Nothing
// starves (B finishes, then F). Expected with overcommit 1: F waits until it fits beside what
// bounded sequences hold and are owed (and the reserve), no preemption.
TEST(SchedulerTest, NoOvercommitNoPreemptionBesideBoundedSequences) {
  Harness h(20, Config(/*max_step_tokens=*/16, 8, /*prefill_chunk=*/8));
  ASSERT_EQ(h.sched().ScratchPages(), 8);
  h.Enqueue(8, 200, /*budget=*/3);
  h.Enqueue(8, 80);
  ASSERT_TRUE(h.RunToCompletion(20000));
  EXPECT_EQ(h.stats().finished, 2);
  EXPECT_EQ(h.stats().preemptions, 0);
}

// ---------------------------------------------------------------------------------------------
// Random workloads.

struct Workload {
  int32_t pages;
  SchedulerConfig config;
  double bounded_fraction;  // 0: full only, 1: bounded only
};

Workload RandomWorkload(std::mt19937& rng, double bounded_fraction) {
  auto uni = [&](int32_t lo, int32_t hi) {
    return std::uniform_int_distribution<int32_t>(lo, hi)(rng);
  };
  Workload w;
  w.pages = uni(6, 60);
  const double overcommit[] = {1.0, 1.0, 1.5, 4.0};
  w.config = Config(uni(1, 48), uni(1, 12), uni(1, 40), overcommit[uni(0, 3)]);
  w.bounded_fraction = bounded_fraction;
  return w;
}

// Runs one random workload: sequences arrive over time; only those Fits() accepts are submitted.
RunStats RunRandom(uint32_t seed, double bounded_fraction, int64_t* total_steps,
                   EvictGranularity granularity = EvictGranularity::kToken,
                   LayerBudgets layers = LayerBudgets::kUniform, bool prefix = false) {
  std::mt19937 rng(seed);
  auto uni = [&](int32_t lo, int32_t hi) {
    return std::uniform_int_distribution<int32_t>(lo, hi)(rng);
  };
  const Workload w = RandomWorkload(rng, bounded_fraction);
  Harness h(w.pages * Harness::LayerShape(layers).NumTables(), w.config, granularity, layers,
            seed, prefix ? uni(0, 40) : -1);
  const int32_t wanted = uni(1, 24);
  struct Arrival {
    int64_t step;
    int32_t prompt, max_total, budget;
  };
  std::vector<Arrival> arrivals;
  int64_t t = 0;
  for (int attempt = 0; attempt < 1000 && static_cast<int32_t>(arrivals.size()) < wanted;
       ++attempt) {
    t += uni(0, 3);
    Arrival a;
    a.step = t;
    a.prompt = uni(1, 40);
    a.max_total = a.prompt + uni(1, 40);
    const bool bounded = std::bernoulli_distribution(bounded_fraction)(rng);
    a.budget = bounded ? uni(1, a.max_total - 1) : 0;
    int32_t need, have;
    if (!h.sched().Fits(a.max_total, bounded ? h.window() : nullptr, a.budget, &need, &have)) {
      continue;
    }
    arrivals.push_back(a);
  }
  const int64_t num = static_cast<int64_t>(arrivals.size());
  size_t next = 0;
  const int64_t kMaxSteps = 20000;
  for (int64_t step = 0; step < kMaxSteps; ++step) {
    while (next < arrivals.size() && arrivals[next].step <= step) {
      const Arrival& a = arrivals[next++];
      h.Enqueue(a.prompt, a.max_total, a.budget);
    }
    if (next == arrivals.size() && h.sched().num_running() == 0 && h.sched().num_waiting() == 0) {
      break;
    }
    const bool idle_with_work = h.sched().num_running() == 0 && h.sched().num_waiting() > 0;
    StepPlan plan = h.Step();
    if (::testing::Test::HasFailure()) break;
    if (idle_with_work) {
      EXPECT_FALSE(plan.chunks.empty()) << "nothing running, yet the head was not admitted";
    }
  }
  *total_steps += h.stats().steps;
  RunStats out = h.stats();
  out.prefix_hits = h.cache().prefix_stats().hits;
  out.reclaimed_pages = h.cache().prefix_stats().reclaimed_pages;
  EXPECT_EQ(h.stats().finished, num)
      << "seed " << seed << ": not all sequences finished in " << kMaxSteps
      << " steps (starvation or livelock); pages " << w.pages << ", step tokens "
      << w.config.max_step_tokens << ", max running " << w.config.max_running << ", chunk "
      << w.config.prefill_chunk << ", overcommit " << w.config.full_overcommit;
  EXPECT_EQ(h.cache().allocator().num_pages_used(), h.cache().CachedPages()) << "seed " << seed;
  EXPECT_EQ(h.cache().SharedCachedPages(), 0) << "seed " << seed;
  if (bounded_fraction == 1.0) {
    EXPECT_EQ(h.stats().preemptions, 0) << "seed " << seed;
  }
  if (bounded_fraction == 0.0 && w.config.full_overcommit == 1.0) {
    EXPECT_EQ(h.stats().preemptions, 0) << "seed " << seed << ": overcommit 1 preempted";
  }
  return out;
}

// Runs the seeds [first, last] (until a failure) and returns their steps and preemptions in all.
RunStats RunSeeds(uint32_t first, uint32_t last, double bounded_fraction,
                  EvictGranularity granularity = EvictGranularity::kToken,
                  LayerBudgets layers = LayerBudgets::kUniform, bool prefix = false) {
  RunStats all;
  for (uint32_t seed = first; seed <= last && !::testing::Test::HasFailure(); ++seed) {
    const RunStats r =
        RunRandom(seed, bounded_fraction, &all.steps, granularity, layers, prefix);
    all.preemptions += r.preemptions;
    all.prefix_hits += r.prefix_hits;
    all.reclaimed_pages += r.reclaimed_pages;
  }
  return all;
}

TEST(SchedulerRandomTest, FullCacheOnly) {
  const RunStats r = RunSeeds(1, 300, 0.0);
  EXPECT_GT(r.steps, 2000);
  EXPECT_GT(r.preemptions, 0) << "the workloads never exercised preemption";
}

// Prefix caching under the same workloads: prompts share a random number of first tokens; hits
// are copies (window) or shared pages (full), cached pages count as available and are reclaimed
// by any allocation, and still every plan's pages are there, nothing is preempted at overcommit
// 1 among full sequences, and nothing leaks (the cache's pages aside).
TEST(SchedulerRandomTest, FullCacheOnlyWithPrefixCache) {
  const RunStats r =
      RunSeeds(6001, 6200, 0.0, EvictGranularity::kToken, LayerBudgets::kUniform, true);
  EXPECT_GT(r.steps, 1000);
  EXPECT_GT(r.prefix_hits, 100) << "the workloads never shared a prefix";
  EXPECT_GT(r.reclaimed_pages, 0) << "the workloads never reclaimed a cached page";
}

TEST(SchedulerRandomTest, MixedWithPrefixCache) {
  const RunStats r =
      RunSeeds(7001, 7200, 0.5, EvictGranularity::kToken, LayerBudgets::kUniform, true);
  EXPECT_GT(r.steps, 1000);
  EXPECT_GT(r.prefix_hits, 100);
  EXPECT_GT(r.reclaimed_pages, 0);
}

TEST(SchedulerRandomTest, BoundedOnly) { EXPECT_GT(RunSeeds(1001, 1300, 1.0).steps, 2000); }

// Page granularity: heads hold up to a page over the budget, and admission counts that page
// (PeakDecodeSlots), so bounded sequences still never preempt.
TEST(SchedulerRandomTest, BoundedOnlyAtPageGranularity) {
  EXPECT_GT(RunSeeds(3001, 3300, 1.0, EvictGranularity::kPage).steps, 2000);
}

TEST(SchedulerRandomTest, MixedAtPageGranularity) {
  EXPECT_GT(RunSeeds(4001, 4200, 0.5, EvictGranularity::kPage).steps, 2000);
}

// Layer budgets: pyramid's are known at admission, squeeze's only once a sequence has run (here
// a random split of L x budget after its first step): admission's PeakPages bound holds for any
// split, so bounded sequences still never preempt and never hold more than their worst case.
TEST(SchedulerRandomTest, BoundedOnlyWithPyramidLayerBudgets) {
  EXPECT_GT(RunSeeds(5001, 5200, 1.0, EvictGranularity::kToken, LayerBudgets::kPyramid).steps,
            2000);
}

TEST(SchedulerRandomTest, BoundedOnlyWithSqueezeLayerBudgets) {
  EXPECT_GT(RunSeeds(6001, 6200, 1.0, EvictGranularity::kToken, LayerBudgets::kSqueeze).steps,
            2000);
}

TEST(SchedulerRandomTest, MixedWithSqueezeLayerBudgetsAtPageGranularity) {
  EXPECT_GT(RunSeeds(7001, 7200, 0.5, EvictGranularity::kPage, LayerBudgets::kSqueeze).steps,
            2000);
}

TEST(SchedulerRandomTest, Mixed) {
  const RunStats r = RunSeeds(2001, 2400, 0.5);
  EXPECT_GT(r.steps, 2000);
  EXPECT_GT(r.preemptions, 0);
}

}  // namespace
}  // namespace heavykv

namespace heavykv {
namespace {

// Fair sharing between clients, with the scheduler driven directly (the harness above checks the
// first-come-first-served contract of a single client).

// A 4-token prompt of `client` with room for `max_total`, owned by `seqs`, queued in `sched`.
Sequence* EnqueueFor(Scheduler& sched, std::vector<std::unique_ptr<Sequence>>& seqs,
                     const std::string& client, int32_t max_total) {
  auto s = std::make_unique<Sequence>();
  s->id = static_cast<int64_t>(seqs.size()) + 1;
  s->tokens.assign(4, kToken);
  s->num_prompt = 4;
  s->max_total = max_total;
  s->client = client;
  sched.Enqueue(s.get());
  seqs.push_back(std::move(s));
  return seqs.back().get();
}
TEST(SchedulerFairnessTest, AWaitingClientTakesASlotFromAFloodingOne) {
  for (const bool fair : {true, false}) {
    SCOPED_TRACE(fair ? "fair" : "fcfs");
    std::unique_ptr<KvCache> cache = *KvCache::Create(TinyShape(), 64);
    SchedulerConfig config = Config(64, /*max_running=*/2, /*prefill_chunk=*/8);
    config.fair_share = fair;
    Scheduler sched(cache.get(), config);
    std::vector<std::unique_ptr<Sequence>> seqs;
    auto add = [&](const std::string& client) { return EnqueueFor(sched, seqs, client, 32); };
    Sequence* a1 = add("a");
    Sequence* a2 = add("a");
    Sequence* a3 = add("a");
    StepPlan first = sched.Schedule();
    ASSERT_EQ(first.admitted, (std::vector<Sequence*>{a1, a2}));
    Sequence* b1 = add("b");
    StepPlan second = sched.Schedule();
    if (fair) {  // a holds both slots, above its share of 1: its newest makes room for b
      EXPECT_EQ(second.preempted, std::vector<Sequence*>{a2});
      EXPECT_EQ(second.admitted, std::vector<Sequence*>{b1});
      EXPECT_EQ(sched.running(), (std::vector<Sequence*>{a1, b1}));
      // a2 waits ahead of a3 (preempted ones keep their place), and a is at its share: no
      // more preemption while the counts are even.
      EXPECT_EQ(std::vector<Sequence*>(sched.waiting().begin(), sched.waiting().end()),
                (std::vector<Sequence*>{a2, a3}));
      EXPECT_TRUE(sched.Schedule().preempted.empty());
    } else {  // b queues behind a3
      EXPECT_TRUE(second.preempted.empty());
      EXPECT_TRUE(second.admitted.empty());
      EXPECT_EQ(std::vector<Sequence*>(sched.waiting().begin(), sched.waiting().end()),
                (std::vector<Sequence*>{a3, b1}));
    }
    for (auto& s : seqs) cache->Release(s->kv);
  }
}

TEST(SchedulerFairnessTest, AdmissionPrefersTheClientWithTheFewestRunning) {
  std::unique_ptr<KvCache> cache = *KvCache::Create(TinyShape(), 64);
  Scheduler sched(cache.get(), Config(64, /*max_running=*/3, /*prefill_chunk=*/8));
  std::vector<std::unique_ptr<Sequence>> seqs;
  auto add = [&](const std::string& client) { return EnqueueFor(sched, seqs, client, 16); };
  Sequence* a1 = add("a");
  Sequence* a2 = add("a");
  Sequence* a3 = add("a");
  Sequence* b1 = add("b");
  Sequence* c1 = add("c");
  // a1 first (nobody runs), then b1 and c1 (0 running each) before a's second and third.
  StepPlan plan = sched.Schedule();
  EXPECT_EQ(plan.admitted, (std::vector<Sequence*>{a1, b1, c1}));
  EXPECT_EQ(std::vector<Sequence*>(sched.waiting().begin(), sched.waiting().end()),
            (std::vector<Sequence*>{a2, a3}));
  for (auto& s : seqs) cache->Release(s->kv);
}

// ---------------------------------------------------------------------------------------------
// Held sequences (backpressure, issue 41: RequestHandle::Hold).

bool Running(Harness& h, const Sequence* s) {
  const auto& r = h.sched().running();
  return std::find(r.begin(), r.end(), s) != r.end();
}

// A held sequence gets no chunk and takes no batch slot; released beyond max_running, the newest
// waits again.
TEST(SchedulerHeldTest, HeldSequencesGetNoChunkAndTakeNoSlot) {
  Harness h(128, Config(64, /*max_running=*/2, 16));
  Sequence* a = h.Enqueue(2, 40);
  Sequence* b = h.Enqueue(2, 40);
  h.StepHeld();
  a->held = b->held = true;
  const size_t a_tokens = a->tokens.size();
  Sequence* c = h.Enqueue(2, 40);
  Sequence* d = h.Enqueue(2, 40);
  StepPlan p = h.StepHeld();
  EXPECT_EQ(p.admitted, (std::vector<Sequence*>{c, d}));  // two slots though four run
  EXPECT_TRUE(p.preempted.empty());
  EXPECT_EQ(h.sched().num_running(), 4);
  EXPECT_EQ(h.sched().num_active(), 2);
  for (int i = 0; i < 5; ++i) h.StepHeld();
  EXPECT_EQ(a->tokens.size(), a_tokens);  // no progress while held
  EXPECT_GT(a->kv.NumPages(), 0);         // pages kept
  a->held = false;  // three active now: the newest active one (d) waits again
  p = h.StepHeld();
  EXPECT_EQ(p.preempted, (std::vector<Sequence*>{d}));
  EXPECT_TRUE(Running(h, a));
  EXPECT_GT(a->tokens.size(), a_tokens);
  b->held = false;
  ASSERT_TRUE(h.RunHeldToCompletion(1000));
  EXPECT_EQ(h.stats().finished, 4);
  EXPECT_EQ(h.cache().allocator().num_pages_used(), 0);
}

// A sequence that cannot be admitted for want of pages preempts a held one (not one that runs);
// a held waiting sequence is not admitted until it is released, then it is recomputed.
TEST(SchedulerHeldTest, HeldSequencesArePreemptedFirstAndWaitUntilReleased) {
  // 12 pages = 48 slots; each sequence grows to 36 tokens = 9 pages, so one runs at a time
  // (overcommit 1).
  Harness h(12, Config(64, 8, 64));
  Sequence* a = h.Enqueue(8, 36);
  h.StepHeld();
  h.StepHeld();
  a->held = true;
  const size_t a_tokens = a->tokens.size();
  Sequence* b = h.Enqueue(8, 36);
  StepPlan p = h.StepHeld();
  EXPECT_EQ(p.preempted, (std::vector<Sequence*>{a}));
  EXPECT_EQ(p.admitted, (std::vector<Sequence*>{b}));
  EXPECT_EQ(a->kv.NumPages(), 0);
  EXPECT_EQ(a->tokens.size(), a_tokens);  // nothing lost
  // Held and waiting: never admitted, even once b is done.
  while (Running(h, b)) h.StepHeld();
  for (int i = 0; i < 5; ++i) {
    p = h.StepHeld();
    EXPECT_TRUE(p.admitted.empty());
  }
  a->held = false;
  p = h.StepHeld();
  ASSERT_EQ(p.admitted, (std::vector<Sequence*>{a}));
  ASSERT_FALSE(p.chunks.empty());
  EXPECT_EQ(p.chunks[0].start, 0);  // recomputed from its first token
  ASSERT_TRUE(h.RunHeldToCompletion(1000));
  EXPECT_EQ(h.stats().finished, 2);
  EXPECT_EQ(h.cache().allocator().num_pages_used(), 0);
}

// A running full-cache sequence that needs pages to grow takes them from a held one, not from
// the newest running one.
TEST(SchedulerHeldTest, GrowingSequencesTakePagesFromHeldOnesFirst) {
  Harness h(12, Config(64, 8, 64, /*full_overcommit=*/4.0));
  Sequence* a = h.Enqueue(8, 36);
  Sequence* b = h.Enqueue(8, 36);
  Sequence* c = h.Enqueue(8, 36);
  h.StepHeld();
  b->held = true;  // not the newest
  bool preempted_b = false;
  for (int i = 0; i < 200 && !preempted_b; ++i) {
    StepPlan p = h.StepHeld();
    for (Sequence* v : p.preempted) {
      EXPECT_EQ(v, b) << "a running sequence was preempted while a held one had pages";
      preempted_b |= v == b;
    }
  }
  EXPECT_TRUE(preempted_b);
  EXPECT_TRUE(Running(h, a));
  EXPECT_TRUE(Running(h, c));
  b->held = false;
  ASSERT_TRUE(h.RunHeldToCompletion(5000));
  EXPECT_EQ(h.stats().finished, 3);
  EXPECT_EQ(h.cache().allocator().num_pages_used(), 0);
}

// Random workloads whose sequences are held and released at random: every step keeps the page
// and limit rules, nothing leaks, and once nothing is held any more everything finishes.
TEST(SchedulerHeldTest, RandomHoldsKeepTheRulesAndEverythingFinishes) {
  for (uint32_t seed = 1; seed <= 150 && !::testing::Test::HasFailure(); ++seed) {
    std::mt19937 rng(seed);
    auto uni = [&](int32_t lo, int32_t hi) {
      return std::uniform_int_distribution<int32_t>(lo, hi)(rng);
    };
    const Workload w = RandomWorkload(rng, seed % 3 == 0 ? 0.0 : seed % 3 == 1 ? 1.0 : 0.5);
    Harness h(w.pages, w.config, EvictGranularity::kToken, LayerBudgets::kUniform, seed);
    std::vector<Sequence*> all;
    for (int i = 0, n = uni(1, 16); i < n; ++i) {
      const int32_t prompt = uni(1, 30), max_total = prompt + uni(1, 30);
      const bool bounded = std::bernoulli_distribution(w.bounded_fraction)(rng);
      const int32_t budget = bounded ? uni(1, max_total - 1) : 0;
      int32_t need, have;
      if (!h.sched().Fits(max_total, bounded ? h.window() : nullptr, budget, &need, &have)) {
        continue;
      }
      all.push_back(h.Enqueue(prompt, max_total, budget));
    }
    for (int step = 0; step < 300 && !::testing::Test::HasFailure(); ++step) {
      for (const auto& s : h.seqs()) {
        if (uni(0, 9) == 0) s->held = !s->held;
      }
      h.StepHeld();
    }
    for (const auto& s : h.seqs()) s->held = false;
    ASSERT_TRUE(h.RunHeldToCompletion(20000)) << "seed " << seed;
    EXPECT_EQ(h.stats().finished, static_cast<int64_t>(all.size())) << "seed " << seed;
    EXPECT_EQ(h.cache().allocator().num_pages_used(), 0) << "seed " << seed;
  }
}

}  // namespace
}  // namespace heavykv

namespace heavykv {
namespace {

// n choices (Scheduler::Fork): full-cache choices run on their parent's prompt pages, which
// admission counts once, so eight run at once in a pool where eight copies would not fit
// (40 pages; 32-token prompt = 8 pages, 36 tokens at most = 9 pages each: 72 as copies, 8 + 8
// shared). Bounded choices get copies and are counted like any bounded sequence; one that does
// not fit waits and computes its prompt itself. Every page goes back.
TEST(SchedulerTest, ForkedChoicesShareTheFullCachesPromptAndWaitWhenNothingFits) {
  Harness h(40, Config(/*max_step_tokens=*/64, 64, /*prefill_chunk=*/32));
  Sequence* parent = h.Enqueue(32, 36);
  while (parent->num_computed < parent->num_prompt) h.Step();
  for (int i = 0; i < 7; ++i) {
    bool running = false;
    h.Fork(parent, &running);
    EXPECT_TRUE(running) << "choice " << i + 1;
  }
  EXPECT_EQ(h.cache().ForkSharedPages(), 8);
  EXPECT_EQ(h.cache().allocator().num_pages_used(), 8);  // the prompt's, once
  ASSERT_TRUE(h.RunToCompletion(1000));
  EXPECT_EQ(h.stats().max_running, 8);
  EXPECT_EQ(h.stats().preemptions, 0);
  EXPECT_EQ(h.cache().allocator().num_pages_used(), 0);

  // Bounded (window, budget 8: 3 pages at most each, 2 of them copies) in a pool of 20 with 6
  // scratch pages: three choices fit beside the parent, the fourth and fifth wait.
  Harness b(20, Config(/*max_step_tokens=*/8, 64, /*prefill_chunk=*/8));
  ASSERT_EQ(b.sched().ScratchPages(), 6);
  Sequence* q = b.Enqueue(8, 40, /*budget=*/8);
  while (q->num_computed < q->num_prompt) b.Step();
  std::vector<bool> ran;
  for (int i = 0; i < 5; ++i) {
    bool running = false;
    b.Fork(q, &running);
    ran.push_back(running);
  }
  EXPECT_EQ(ran, (std::vector<bool>{true, true, true, false, false}));
  EXPECT_EQ(b.sched().num_waiting(), 2);
  ASSERT_TRUE(b.RunToCompletion(5000));
  EXPECT_EQ(b.stats().finished, 6);
  EXPECT_EQ(b.cache().allocator().num_pages_used(), 0);
}

}  // namespace
}  // namespace heavykv
