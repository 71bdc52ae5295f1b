// Scheduler: iteration-level (continuous) batching over the shared KV pool.
//
// Each call to Schedule() plans one forward step, pages included (ScheduledChunk::new_pages): a decode token for every running sequence that
// has finished its prompt, then prefill chunks of running sequences, then newly admitted ones,
// first come first served, within a per-step token limit and a maximum number of running
// sequences. It talks in plain data: it returns a StepPlan; the engine runs it and updates each
// Sequence (num_computed, tokens). It never calls kernels.
//
// Admission is by pages. A sequence whose KV budget bounds it (a policy with a budget below its
// maximum length) holds at most ceil((budget + 1) / block_size) pages between and during decode
// steps (ceil((budget + block_size) / block_size) at page granularity: PeakDecodeSlots): it is
// admitted only when the pool can hold that on top of what is still owed to the bounded
// sequences already running, so bounded sequences never run out of pages. A prefill chunk
// holds up to a chunk's worth of tokens over the budget until its layers evict; those transient
// pages come from one shared scratch reserve (ceil(max_step_tokens / block_size) + 4 pages) kept
// free at admission, and a chunk is shortened to fit what is left of it (a bounded sequence
// always fits at least one token in its owed pages). A full-cache sequence is admitted when its
// first chunk fits beside what is owed and reserved (and within the overcommit limit), and grows
// as it goes, into the reserve if need be; when the pool cannot hold its
// next step, the newest running sequence is preempted: its pages are released and it waits again
// at the head of the queue, to be recomputed from its tokens so far. No request fails for lack of
// memory; a request that could never fit even alone is refused at submission (Fits()).
//
// Held sequences (Sequence::held: their client stopped reading) keep their pages but get no
// chunk and take no batch slot; a sequence that is not held and cannot be admitted for want of
// pages preempts the newest held one first, and a full-cache sequence that needs pages
// to grow takes them from held sequences before it preempts one that runs. Released sequences
// beyond max_running (several resumed at once) are preempted, newest first.
//
// Fairness between clients (Sequence::client): admission takes, among the waiting sequences, one
// of the client with the fewest running sequences (the oldest of those), so one client's flood
// does not queue everyone else behind it; with a single client this is first come first served.
// When the batch is full (max_running) and a client below its fair share (max_running / clients
// with work) waits, the newest running sequence of the client furthest above its share is
// preempted (at most one per step) to make room.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "memory/kv_cache.h"

namespace heavykv {

// A request's sequence as the scheduler sees it. Owned by the engine.
struct Sequence {
  int64_t id = 0;
  std::vector<int32_t> tokens;  // prompt, then each sampled token
  int32_t num_prompt = 0;
  int32_t num_computed = 0;     // tokens [0, num_computed) are in the cache
  int32_t max_total = 0;        // prompt + max_new_tokens
  SequenceKv kv;                // kv.policy / kv.budget set by the engine
  int32_t preemptions = 0;
  absl::Time arrival;
  std::string client;           // who sent it; fair sharing between clients
  // Its client is not reading (RequestHandle::Hold): it gets no chunk, is not counted against
  // max_running, is not admitted while waiting, and is the first preempted when another
  // sequence needs pages or a batch slot. Set by the engine before each Schedule().
  bool held = false;
  // n choices: the sequence this one was forked from (Scheduler::Fork); 0 for none.
  int64_t fork_of = 0;

  // Bounded by its budget: its pages never exceed WorstCasePages().
  bool bounded() const { return kv.policy != nullptr && kv.budget < max_total; }
  int32_t pending() const { return static_cast<int32_t>(tokens.size()) - num_computed; }
  std::span<const int32_t> prompt() const {
    return std::span<const int32_t>(tokens).first(static_cast<size_t>(num_prompt));
  }
};

struct SchedulerConfig {
  int32_t max_step_tokens = 512;
  int32_t max_running = 64;
  int32_t prefill_chunk = 256;  // at most this many prompt tokens of one sequence per step
  // Full-cache sequences are admitted while the pages they could grow to, summed, stay within
  // this multiple of the pool. 1 never preempts; above 1 bets that requests end early (EOS) and
  // preempts when the bet is lost. Measured with every request running to its length, 1 was
  // 10x faster than admitting on the first chunk alone (which preempted 1255 times).
  double full_overcommit = 1.0;
  // Fair admission and fair-share preemption between clients (class comment); false: first come
  // first served, whoever sent it.
  bool fair_share = true;
};

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int32_t start = 0;  // feed tokens [start, start + count) at those positions
  int32_t count = 0;
  // True when the chunk reaches the last known token: its logits yield the next token.
  bool samples = false;
  // Pages the chunk adds to the sequence's block table (KvCache::PagesNeeded for `count`), as
  // the admission arithmetic counted them. The engine allocates them (ApplyPagePlan) before the
  // step runs, so the runner's own Reserve finds nothing left to allocate.
  int32_t new_pages = 0;
};

struct StepPlan {
  std::vector<ScheduledChunk> chunks;
  std::vector<Sequence*> preempted;  // released this step, back in the waiting queue
  std::vector<Sequence*> admitted;   // moved from waiting to running this step
  int32_t num_tokens = 0;
};

// Allocates every chunk's new_pages in `cache` (the only mutation of the plan's pages), all or
// nothing: INTERNAL if the pool cannot hold them or a sequence needs a different count than
// planned (the scheduler's arithmetic and the cache disagree: a broken invariant).
absl::Status ApplyPagePlan(const StepPlan& plan, KvCache& cache);

class Scheduler {
 public:
  // `cache` is read for page counts; Schedule() releases the pages of preempted sequences.
  Scheduler(KvCache* cache, const SchedulerConfig& config);
  const KvCache& cache() const { return *cache_; }

  void Enqueue(Sequence* seq);  // joins the waiting queue (FCFS)
  // Forgets a finished or cancelled sequence, waiting or running. Its pages must already have
  // been released by the caller.
  void Remove(Sequence* seq);
  StepPlan Schedule();
  // n choices (docs/ARCHITECTURE.md "The sampling API"), between steps: `child` (tokens: the
  // parent's prompt and its first token; no pages) joins the running batch on a KvCache::Fork
  // of `parent`'s pages (parent running, its prompt computed, nothing past it) when they fit
  // beside what is owed and promised and a batch slot is free; true then. Otherwise it waits at
  // the head of the queue (after its siblings that wait: choices keep their order) with nothing
  // computed, to compute its prompt once admitted (false).
  bool Fork(const Sequence& parent, Sequence* child);

  // Pages a bounded sequence is owed (PeakPages): per table ceil(min(PeakDecodeSlots, max_total)
  // / block_size) with its layer's budget, where the peak is budget + 1 (budget + block_size at
  // page granularity); for a full-cache one, ceil(max_total / block_size) per table.
  int32_t WorstCasePages(const Sequence& seq) const;
  // Pages kept aside for prefill chunks of bounded sequences above their budget:
  // (ceil(max_step_tokens / block_size) + 4) per table.
  int32_t ScratchPages() const;
  // Whether a sequence of `max_total` tokens under `policy` (null: full) and `budget` (with its
  // own row type `quant`, SequenceKv::quant) could ever run in this pool alone; *need gets the
  // pages it needs, *have the pages it could get.
  bool Fits(int32_t max_total, const EvictionPolicy* policy, int32_t budget, int32_t* need,
            int32_t* have, KvQuant quant = KvQuant::kNone) const;

  // Running sequences, held ones included (they keep their pages).
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  // Running sequences that are not held: those max_running bounds.
  int32_t num_active() const;
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  const std::vector<Sequence*>& running() const { return running_; }
  const std::deque<Sequence*>& waiting() const { return waiting_; }

 private:
  int32_t PagesFor(int64_t slots) const;
  static int32_t PagesClamped(int64_t pages);
  // Pages a bounded running sequence may still claim beyond what it holds now.
  int32_t Owed(const Sequence& seq) const;
  int32_t TotalOwed() const;
  // Whether `more` pages beyond what running sequences are promised (their worst cases, the
  // scratch reserve while bounded ones run, pages several hold counted once) pass the full
  // cache's overcommit limit.
  bool OverPromised(int64_t more) const;
  // Whether a bounded sequence runs (the scratch reserve exists only then).
  bool AnyBoundedRunning() const;
  void Preempt(Sequence* seq, StepPlan& plan);
  // Index in waiting_ of the next sequence to admit: the oldest of the client with the fewest
  // running sequences, held ones skipped; waiting_.size() when every waiting one is held.
  size_t NextToAdmit() const;
  // Preempts the newest held running sequence, if any, adding what its release makes available
  // to *free and taking what it was owed from *owed.
  bool PreemptHeld(StepPlan& plan, int32_t* free, int32_t* owed);
  // Frees a batch slot for a waiting client below its fair share (see the class comment).
  void PreemptForFairness(StepPlan& plan);

  KvCache* cache_;
  SchedulerConfig config_;
  std::vector<Sequence*> running_;  // in admission order: the back is the newest
  std::deque<Sequence*> waiting_;
};

}  // namespace heavykv
