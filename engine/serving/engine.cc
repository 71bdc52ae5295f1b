#include "engine/serving/engine.h"

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/grammar/constraint.h"
#include "engine/runner/model_runner.h"
#include "engine/serving/generator.h"
#include "engine/serving/mask_prefetcher.h"
#include "engine/serving/prompt_scoring.h"
#include "engine/serving/request_field.h"
#include "engine/serving/request_validation.h"
#include "engine/serving/scheduler.h"
#include "engine/tokenizer/text_stream.h"
#include "kernels/cpu/gemm.h"
#include "memory/eviction_policy.h"

namespace heavykv {
namespace {

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// The status of a request's last delta when its deadline, not its client or a shutdown, stopped
// it (finish reason "cancelled"): the gRPC front ends the call with it.
absl::Status DeadlineExceeded() {
  return absl::DeadlineExceededError("the request's deadline passed");
}

// The status of a request cancelled because it was held (its client read nothing) too long.
absl::Status Stalled(absl::Duration timeout) {
  return absl::DeadlineExceededError(absl::StrCat(
      "the client read nothing for ", absl::FormatDuration(timeout),
      " (--stream-stall-timeout): the stream was cancelled"));
}

// Prompt tokens of one sequence per step: long prompts are split so decodes keep flowing.
int32_t PrefillChunk(const EngineOptions& o) { return std::max(1, std::min(256, o.max_step_tokens)); }

struct Request;

// The choices of a request with n > 1 (docs/ARCHITECTURE.md "The sampling API"): one Request
// each, made from choice 0 when its prompt's logits are sampled. Engine thread only (choice 0
// alone exists before that, so the tokenizer thread never sees a group with others).
struct ChoiceGroup {
  int32_t n = 1;
  bool forked = false;      // choices 1..n-1 were made
  int32_t unfinished = 1;   // choices made whose last delta has not been sent
  int32_t completion = 0;   // completion tokens of the finished choices
  int32_t peak_pages = 0;   // the most distinct pages the choices held at once
  int64_t counted_pages = -1;  // the choices' pages summed when peak_pages was last measured
  std::function<void(const GenerationDelta&)> on_delta;  // the client's
};

// One request inside the engine. Created by Submit; owned by the tokenizer thread while its text
// prompt is tokenized (`raw` holds it until then), by the engine thread from then on.
struct Request {
  GenerationRequest raw;
  absl::Time arrival;
  ResolvedRequest params;
  Sequence seq;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<TextStream> text;
  // Structured output: compiled in Submit, where its matcher is made; the matcher follows the
  // sampled tokens. `mask` is its next step's mask [vocab words], filled by the prefetcher when
  // `mask_posted`.
  std::shared_ptr<grammar::ConstraintMatcher> matcher;
  std::shared_ptr<std::vector<uint64_t>> mask;
  bool mask_posted = false;
  std::function<void(const GenerationDelta&)> on_delta;
  std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<std::atomic<bool>> held = std::make_shared<std::atomic<bool>>(false);
  absl::Time held_since = absl::InfiniteFuture();  // since when it has been held, at a stretch
  absl::Time admitted = absl::InfinitePast();
  absl::Time first_token = absl::InfinitePast();
  absl::Time last_token = absl::InfinitePast();
  int32_t completion = 0;
  int32_t cached_tokens = 0;  // of its prompt, from the prefix cache at its first admission
  // prompt_logprobs >= 0: its prompt's scores as its chunks run, then (`prompt_scores`) the
  // result until its first delta carries it.
  std::unique_ptr<PromptScorer> prompt_scorer;
  std::shared_ptr<const PromptLogprobs> prompt_scores;
  bool waiting = true;  // counted in the engine's waiting count
  bool done = false;    // its final delta was sent; dropped from live_ at the end of the step
  // n > 1: the choices' shared state, and which choice this is (0: the one submitted).
  std::shared_ptr<ChoiceGroup> group;
  int32_t index = 0;
};

class Handle final : public RequestHandle {
 public:
  Handle(std::shared_ptr<std::atomic<bool>> cancelled, std::shared_ptr<std::atomic<bool>> held,
         std::function<void()> wake)
      : cancelled_(std::move(cancelled)), held_(std::move(held)), wake_(std::move(wake)) {}
  void Cancel() override {
    cancelled_->store(true);
    wake_();
  }
  void Hold(bool held) override {
    if (held_->exchange(held) && !held) wake_();  // released: its next step need not wait
  }

 private:
  std::shared_ptr<std::atomic<bool>> cancelled_, held_;
  std::function<void()> wake_;
};

class EngineImpl final : public Engine {
 public:
  // `model` is the one `runner` was made over (owned here from now on).
  EngineImpl(std::unique_ptr<Model> model, std::shared_ptr<const TextTokenizer> tokenizer,
             const EngineOptions& options, std::unique_ptr<KvCache> cache,
             std::unique_ptr<StepRunner> runner)
      : model_holder_(std::move(model)),
        model_(*model_holder_),
        tokenizer_(std::move(tokenizer)),
        options_(options),
        cache_(std::move(cache)),
        runner_(std::move(runner)),
        scheduler_(cache_.get(), SchedulerConfig{options.max_step_tokens, options.max_running,
                                                 PrefillChunk(options), options.full_overcommit,
                                                 options.fair_share}),
        validator_(model_.config, tokenizer_.get(), options_, &scheduler_) {
    stats_.kv_dtype = KvElementName(cache_->shape());  // fixed with the pool
    stats_.bytes_per_token = KvBytesPerPoolToken(cache_->shape());
    PublishStats();  // the pool's size is known before the first request
    thread_ = std::thread([this] { Loop(); });
    prep_thread_ = std::thread([this] { PrepareLoop(); });
  }
  ~EngineImpl() override { Shutdown(absl::ZeroDuration()); }

  absl::StatusOr<std::shared_ptr<RequestHandle>> Submit(
      const GenerationRequest& request,
      std::function<void(const GenerationDelta&)> on_delta) override {
    if (absl::Status s = validator_.Precheck(request); !s.ok()) return s;
    auto r = std::make_unique<Request>();
    r->arrival = absl::Now();
    if (request.constraint.active()) {  // on the caller's thread: a slow schema stalls no one
      absl::StatusOr<std::shared_ptr<const grammar::CompiledConstraint>> c =
          CompileConstraint(request.constraint);
      if (!c.ok()) return WithRequestField(c.status(), "constraint");
      r->matcher = std::make_shared<grammar::ConstraintMatcher>(*std::move(c));
      r->mask = std::make_shared<std::vector<uint64_t>>(size_t(compiler_->vocab().num_words()));
    }
    // Token ids need no tokenizer: resolved here, cheaply. Text waits for the tokenizer thread.
    const bool needs_tokenizer = request.prompt.has_value() || request.messages.has_value();
    if (!needs_tokenizer) {
      absl::StatusOr<ResolvedRequest> params =
          validator_.Resolve(request, *validator_.PromptTokens(request));
      if (!params.ok()) return params.status();
      if (absl::Status s = CheckBackendPolicy(*params); !s.ok()) return s;
      r->params = *std::move(params);
      r->params.arrival = r->arrival;
    } else {
      r->raw = request;
    }
    r->on_delta = std::move(on_delta);
    auto handle = std::make_shared<Handle>(r->cancelled, r->held, [this] {
      cv_.notify_all();
      prep_cv_.notify_all();
    });
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (draining_) return absl::UnavailableError("the server is shutting down; retry elsewhere");
      if (num_waiting_ >= options_.max_waiting) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "the request queue is full (", options_.max_waiting, " waiting); retry later"));
      }
      ++num_waiting_;
      if (needs_tokenizer) {
        ++num_preparing_;
        preparing_.push_back(PrepJob{std::move(r), {}});
      } else {
        incoming_.push_back(std::move(r));
      }
    }
    (needs_tokenizer ? prep_cv_ : cv_).notify_all();
    return std::shared_ptr<RequestHandle>(handle);
  }

  absl::StatusOr<std::shared_ptr<const grammar::CompiledConstraint>> CompileConstraint(
      const grammar::ConstraintSpec& spec) {
    if (tokenizer_ == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a ", spec.KindName(), " constraint needs the model's tokenizer; this server has none"));
    }
    std::call_once(compiler_once_, [this] {
      compiler_ = std::make_unique<grammar::ConstraintCompiler>(
          grammar::TokenVocabulary::FromTokenizer(*tokenizer_));
    });
    return compiler_->Compile(spec);
  }

  absl::StatusOr<std::vector<int32_t>> Tokenize(const std::string& text,
                                                bool add_special) const override {
    return validator_.Encode(text, add_special);
  }

  absl::StatusOr<std::vector<int32_t>> TokenizeChat(const GenerationRequest& chat) const override {
    GenerationRequest q;
    q.messages = chat.messages;
    q.add_generation_prompt = chat.add_generation_prompt;
    q.chat_tools = chat.chat_tools;
    q.chat_template_kwargs = chat.chat_template_kwargs;
    if (absl::Status s = validator_.Precheck(q); !s.ok()) return s;
    return validator_.PromptTokens(q);
  }

  void TokenizeAsync(std::string text, bool add_special,
                     std::shared_ptr<const std::atomic<bool>> cancelled, absl::Time deadline,
                     std::function<void(absl::StatusOr<std::vector<int32_t>>)> done) override {
    // The byte limit first, so that no unbounded text is queued.
    if (int64_t(text.size()) > validator_.max_prompt_bytes()) {
      return done(validator_.Encode(text, add_special));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!draining_ && int32_t(preparing_.size()) < options_.max_waiting) {
        ++num_preparing_;
        preparing_.push_back(PrepJob{nullptr, TokenizeJob{std::move(text), add_special,
                                                          std::move(cancelled), deadline,
                                                          std::move(done)}});
        prep_cv_.notify_all();
        return;
      }
      if (!draining_) {
        return done(absl::ResourceExhaustedError(absl::StrCat(
            "the tokenizer queue is full (", options_.max_waiting, " waiting); retry later")));
      }
    }
    done(absl::UnavailableError("the server is shutting down; retry elsewhere"));
  }

  absl::StatusOr<std::string> Detokenize(const std::vector<int32_t>& ids,
                                         bool skip_special_tokens) const override {
    if (tokenizer_ == nullptr) {
      return absl::InvalidArgumentError("this server has no tokenizer: it cannot detokenize");
    }
    if (ids.size() > size_t(validator_.max_prompt_tokens())) {
      return absl::InvalidArgumentError(
          absl::StrCat(ids.size(), " token ids; at most ", validator_.max_prompt_tokens(),
                       " are accepted"));
    }
    TextStream stream(tokenizer_.get(), /*prev_token=*/-1, {}, skip_special_tokens);
    std::string text;
    for (int32_t id : ids) {
      if (id < 0 || id >= tokenizer_->vocab_size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "token id ", id, " is outside the vocabulary [0, ", tokenizer_->vocab_size(), ")"));
      }
      bool stopped = false;
      text += stream.Push(id, &stopped);
    }
    return text + stream.Flush();
  }

  ModelInfo Info() const override {
    const ModelConfig& c = model_.config;
    ModelInfo info;
    info.architecture = ArchitectureName(c.arch);
    info.context_length = c.seq_len;
    info.vocab_size = c.vocab_size;
    info.num_layers = c.num_layers;
    info.num_heads = c.num_heads;
    info.num_kv_heads = c.num_kv_heads;
    info.head_dim = c.head_dim();
    for (absl::string_view p : kPolicyNames) info.policies.emplace_back(p);
    info.pages_total = cache_->allocator().num_pages_total();
    info.block_size = cache_->shape().block_size;
    info.page_bytes = cache_->shape().PageBytes();
    if (tokenizer_) info.tokenizer = tokenizer_->Describe();
    info.chat = options_.chat_template != nullptr;
    info.chat_template = options_.chat_template;
    info.max_prompt_tokens = validator_.max_prompt_tokens();
    info.max_prompt_bytes = tokenizer_ ? validator_.max_prompt_bytes() : 0;
    info.max_new_tokens_limit =
        options_.max_new_tokens_limit > 0 ? options_.max_new_tokens_limit : c.seq_len;
    info.device_weight_bytes = runner_->DeviceWeightBytes();
    return info;
  }

  CacheStats Stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    CacheStats s = stats_;
    s.sequences_waiting = num_waiting_;
    return s;
  }

  void Shutdown(absl::Duration grace) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopped_) return;
    draining_ = true;
    cv_.notify_all();
    done_cv_.wait_for(lock, std::chrono::microseconds(absl::ToInt64Microseconds(grace)), [this] {
      return num_live_ == 0 && incoming_.empty() && num_preparing_ == 0;
    });
    force_cancel_ = true;
    force_cancel_flag_.store(true);
    // The tokenizer thread first: it may still hand requests to the engine thread.
    stop_prep_ = true;
    prep_cv_.notify_all();
    lock.unlock();
    prep_thread_.join();
    lock.lock();
    stop_ = true;
    cv_.notify_all();
    lock.unlock();
    thread_.join();
    stopped_ = true;
  }

 private:
  void Loop();
  void Admit(std::unique_ptr<Request> r);
  // Refuses a policy the runner's backend cannot apply (the CUDA runner: no GPU rule).
  absl::Status CheckBackendPolicy(const ResolvedRequest& p) const {
    return runner_->SupportsPolicy(p.kv_policy.get(), p.kv_quant);
  }
  // Sends the final delta (`last` carries the final token, if any), releases the pages.
  void Finish(Request& r, const std::string& reason, GenerationDelta last = {},
              const std::string& error = "");
  void DropFinished();
  // Copies the engine thread's counters where Stats() reads them.
  void PublishStats();
  void OnToken(Request& r, int32_t token, const float* logits);
  // A request's sequence (a new id, its prompt, length, client, K/V settings), sampler and text
  // stream, from its resolved params: Admit's, and each choice's that ForkChoices makes.
  void InitSequence(Request& q);
  // Samples r's next token from the logits row `lrow` (copied into `row`: its constraint's mask,
  // the sampler) and takes it (OnToken); posts its next mask.
  void SampleInto(Request& r, const float* lrow, std::vector<float>& row,
                  std::vector<MaskPrefetcher::Job>& next_masks);
  // n > 1, at choice 0's first sampling step: makes choices 1..n-1 (Scheduler::Fork of its
  // pages) and returns all n, choice 0 first, none of them with a token yet.
  std::vector<Request*> ForkChoices(Request& parent);
  // Updates the forked groups' peak_pages (the end of a step).
  void MeasureGroupPages();
  // Masks `row` [vocab] to the tokens r's constraint allows; false (r finished with an error)
  // when none is.
  bool ApplyConstraint(Request& r, std::vector<float>& row);
  void AddLogprobs(const Request& r, int32_t token, const float* logits,
                   GenerationDelta& d) const;
  // Scores chunk `c` of r's prompt from its step's `rows` (one per token when the chunk ran with
  // all_logits) and, once the prompt is scored, keeps the result for r's first delta.
  void ScorePrompt(Request& r, const ScheduledChunk& c, std::span<const float> rows);
  // The tokenizer thread: tokenizes text prompts and Tokenize calls, one at a time, in order.
  void PrepareLoop();
  // The last delta of a request that never reached the engine thread (tokenizer thread).
  void FinishUnadmitted(Request& r, const std::string& reason, absl::Status status);

  struct TokenizeJob {
    std::string text;
    bool add_special = true;
    std::shared_ptr<const std::atomic<bool>> cancelled;
    absl::Time deadline;
    std::function<void(absl::StatusOr<std::vector<int32_t>>)> done;
  };
  // A request whose text prompt needs tokens, or a Tokenize call (exactly one is set).
  struct PrepJob {
    std::unique_ptr<Request> request;
    std::optional<TokenizeJob> tokenize;
  };

  std::unique_ptr<Model> model_holder_;  // heap-held: the runner keeps a reference to it
  const Model& model_;
  std::shared_ptr<const TextTokenizer> tokenizer_;
  EngineOptions options_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<StepRunner> runner_;
  Scheduler scheduler_;
  RequestValidator validator_;
  std::thread thread_, prep_thread_;

  mutable std::mutex mu_;
  std::condition_variable cv_, done_cv_, prep_cv_;
  std::deque<std::unique_ptr<Request>> incoming_;  // guarded by mu_
  std::deque<PrepJob> preparing_;                    // guarded by mu_
  int32_t num_preparing_ = 0;  // queued or being tokenized; guarded by mu_
  bool stop_prep_ = false;     // guarded by mu_
  std::atomic<bool> force_cancel_flag_ = false;  // force_cancel_, for the tokenizer's checks
  int32_t num_waiting_ = 0;                          // guarded by mu_
  int32_t num_live_ = 0;                             // accepted, not finished; guarded by mu_
  CacheStats stats_;                                 // guarded by mu_
  bool draining_ = false, force_cancel_ = false, stop_ = false, stopped_ = false;

  // Engine thread only.
  std::map<int64_t, std::unique_ptr<Request>> live_;
  int64_t next_id_ = 1;
  // Structured outputs: the vocabulary's trie and the compiled constraints, made at the first
  // constrained request; the next steps' masks are filled while the forward pass runs.
  std::once_flag compiler_once_;
  std::unique_ptr<grammar::ConstraintCompiler> compiler_;
  MaskPrefetcher prefetcher_;
  int64_t tokens_evicted_ = 0, preemptions_ = 0;
  int32_t forked_groups_ = 0;  // groups of choices with a choice still live
};

void EngineImpl::InitSequence(Request& q) {
  const ResolvedRequest& p = q.params;
  q.seq.id = next_id_++;
  q.seq.tokens = p.prompt;
  q.seq.num_prompt = static_cast<int32_t>(p.prompt.size());
  q.seq.max_total = q.seq.num_prompt + p.max_new_tokens;
  q.seq.arrival = p.arrival;
  q.seq.client = p.client;
  q.seq.kv.quant = p.kv_quant;
  // Prompt logprobs need every prompt position computed: no cached prefix.
  q.seq.kv.prefix_enabled = cache_->prefix_cache_enabled() && p.prompt_logprobs < 0;
  q.seq.kv.prefix_root =
      PrefixCache::Root(options_.prefix_cache_share_tenants ? std::string() : p.tenant);
  if (p.kv_policy != nullptr) {  // null for full
    q.seq.kv.policy = p.kv_policy.get();
    q.seq.kv.budget = p.budget_tokens;
  }
  q.sampler = std::make_unique<Sampler>(p.sampling, p.prompt);
  q.text = std::make_unique<TextStream>(tokenizer_.get(), p.prompt.back(), p.stop,
                                        p.skip_special_tokens);
}

void EngineImpl::Admit(std::unique_ptr<Request> r) {
  Request& q = *r;
  const ResolvedRequest& p = q.params;
  InitSequence(q);
  if (p.prompt_logprobs >= 0) {
    q.prompt_scorer =
        std::make_unique<PromptScorer>(p.prompt, p.prompt_logprobs, tokenizer_.get());
  }
  if (p.n > 1) {  // every choice's deltas go to the client's callback through the group
    q.group = std::make_shared<ChoiceGroup>();
    q.group->n = p.n;
    q.group->on_delta = std::move(q.on_delta);
    q.on_delta = [g = q.group.get()](const GenerationDelta& d) { g->on_delta(d); };
  }
  scheduler_.Enqueue(&q.seq);
  live_.emplace(q.seq.id, std::move(r));
}

void EngineImpl::Finish(Request& r, const std::string& reason, GenerationDelta d,
                        const std::string& error) {
  d.index = r.index;
  d.choice_finished = true;
  d.finished = true;
  d.finish_reason = reason;
  d.error = error;
  if (r.prompt_scores != nullptr) d.prompt = std::move(r.prompt_scores);
  d.text += r.text->Flush();
  d.usage.prompt_tokens = r.seq.num_prompt;
  d.usage.completion_tokens = r.completion;
  d.usage.kv_tokens_kept = r.seq.kv.MeanSlots();
  d.usage.kv_tokens_evicted = r.seq.kv.tokens_evicted;
  d.usage.peak_pages = r.seq.kv.peak_pages;
  if (ChoiceGroup* g = r.group.get(); g != nullptr) {
    // The request's last delta is its last choice's; before the fork choice 0 is the only one.
    g->completion += r.completion;
    g->peak_pages = std::max(g->peak_pages, r.seq.kv.peak_pages);
    g->unfinished = g->forked ? g->unfinished - 1 : 0;
    d.finished = g->unfinished == 0;
    if (d.finished && g->forked) --forked_groups_;
    d.usage.completion_tokens = g->completion;
    d.usage.peak_pages = g->peak_pages;
  }
  d.usage.policy = r.params.policy;
  d.usage.kv_budget_tokens = r.params.policy == "full" ? 0 : r.params.budget_tokens;
  d.usage.kv_dtype = r.params.kv_dtype;
  d.usage.cached_tokens = r.cached_tokens;
  const absl::Time now = absl::Now();
  const absl::Time started = r.admitted == absl::InfinitePast() ? now : r.admitted;
  d.timings.queue_seconds = Seconds(started - r.params.arrival);
  d.timings.time_to_first_token_seconds =
      r.first_token == absl::InfinitePast() ? 0 : Seconds(r.first_token - r.params.arrival);
  d.timings.total_seconds = Seconds(now - r.params.arrival);
  cache_->Release(r.seq.kv);
  scheduler_.Remove(&r.seq);
  r.done = true;
  PublishStats();  // a client that saw the final delta sees the pages returned
  if (options_.observer && d.finished) {  // a request, not each of its choices
    options_.observer->OnRequestFinished(reason, d.timings.total_seconds);
  }
  r.on_delta(d);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (r.waiting) --num_waiting_;
    --num_live_;
  }
  done_cv_.notify_all();
}

void EngineImpl::FinishUnadmitted(Request& r, const std::string& reason, absl::Status status) {
  GenerationDelta d;
  d.finished = d.choice_finished = true;
  d.finish_reason = reason;
  d.status = std::move(status);
  d.usage.policy = r.raw.policy.value_or(options_.default_policy);
  d.timings.queue_seconds = d.timings.total_seconds = Seconds(absl::Now() - r.arrival);
  if (reason != "rejected" && options_.observer) {
    options_.observer->OnRequestFinished(reason, d.timings.total_seconds);
  }
  {  // before the delta: a client that saw it sees the queue without it
    std::lock_guard<std::mutex> lock(mu_);
    --num_waiting_;
  }
  r.on_delta(d);
  {
    std::lock_guard<std::mutex> lock(mu_);
    --num_preparing_;
  }
  done_cv_.notify_all();
}

void EngineImpl::PrepareLoop() {
  while (true) {
    PrepJob job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      prep_cv_.wait(lock, [this] { return !preparing_.empty() || stop_prep_; });
      if (preparing_.empty()) break;
      job = std::move(preparing_.front());
      preparing_.pop_front();
    }
    if (job.tokenize.has_value()) {
      TokenizeJob& t = *job.tokenize;
      auto should_stop = [&] {
        return t.cancelled->load() || force_cancel_flag_.load() || absl::Now() > t.deadline;
      };
      absl::StatusOr<std::vector<int32_t>> ids =
          validator_.Encode(t.text, t.add_special, should_stop);
      if (!ids.ok() && ids.status().code() == absl::StatusCode::kCancelled) {
        if (force_cancel_flag_.load()) {
          ids = absl::UnavailableError("the server is shutting down; retry elsewhere");
        } else if (!t.cancelled->load()) {
          ids = absl::DeadlineExceededError("the deadline passed while tokenizing");
        }
      }
      t.done(std::move(ids));
      std::lock_guard<std::mutex> lock(mu_);
      --num_preparing_;
      done_cv_.notify_all();
      continue;
    }
    Request& r = *job.request;
    auto should_stop = [&] {
      return r.cancelled->load() || force_cancel_flag_.load() ||
             (r.raw.deadline && absl::Now() > *r.raw.deadline);
    };
    absl::StatusOr<std::vector<int32_t>> ids = validator_.PromptTokens(r.raw, should_stop);
    if (!ids.ok()) {
      const bool stopped = ids.status().code() == absl::StatusCode::kCancelled;
      const bool expired = stopped && !r.cancelled->load() && !force_cancel_flag_.load();
      FinishUnadmitted(r, stopped ? "cancelled" : "rejected",
                       !stopped ? ids.status() : expired ? DeadlineExceeded() : absl::OkStatus());
      continue;
    }
    absl::StatusOr<ResolvedRequest> params = validator_.Resolve(r.raw, *std::move(ids));
    if (params.ok()) {
      if (absl::Status s = CheckBackendPolicy(*params); !s.ok()) params = s;
    }
    if (!params.ok()) {
      FinishUnadmitted(r, "rejected", params.status());
      continue;
    }
    r.params = *std::move(params);
    r.params.arrival = r.arrival;
    r.raw = GenerationRequest();  // the text is no longer needed
    {
      std::lock_guard<std::mutex> lock(mu_);
      --num_preparing_;
      incoming_.push_back(std::move(job.request));
    }
    cv_.notify_all();
  }
}

void EngineImpl::DropFinished() {
  for (auto it = live_.begin(); it != live_.end();) {
    it = it->second->done ? live_.erase(it) : std::next(it);
  }
}

void EngineImpl::ScorePrompt(Request& r, const ScheduledChunk& c, std::span<const float> rows) {
  PromptScorer& scorer = *r.prompt_scorer;
  if (scorer.NeedsRows(c.start, c.count)) {
    scorer.Score(c.start, c.count, rows, model_.config.vocab_size);
  }
  if (!scorer.complete()) return;
  r.prompt_scores = scorer.Take();
  r.prompt_scorer.reset();  // a recompute after a preemption scores nothing again
}

void EngineImpl::AddLogprobs(const Request& r, int32_t token, const float* logits,
                             GenerationDelta& d) const {
  // Of the model's distribution, before temperature and truncation.
  const std::span<const float> row(logits, model_.config.vocab_size);
  const double lse = Sampler::LogSumExp(row);
  // The token before this one: its bytes depend on it (SentencePiece's space after BOS).
  const int32_t prev = r.seq.tokens.size() >= 2 ? r.seq.tokens[r.seq.tokens.size() - 2] : -1;
  const auto bytes = [&](int32_t id) {
    return tokenizer_ != nullptr ? tokenizer_->Decode(prev, id) : std::string();
  };
  d.logprobs.push_back(static_cast<float>(double(row[token]) - lse));
  d.token_bytes.push_back(bytes(token));
  if (r.params.top_logprobs == 0) return;
  std::vector<TokenLogprob>& top = d.top_logprobs.emplace_back();
  for (int32_t id : Sampler::TopTokens(row, r.params.top_logprobs)) {
    top.push_back({id, static_cast<float>(double(row[id]) - lse), bytes(id)});
  }
}

bool EngineImpl::ApplyConstraint(Request& r, std::vector<float>& row) {
  std::vector<uint64_t>& words = *r.mask;
  if (!r.mask_posted) r.matcher->FillMask(words);  // not prefetched (its first step)
  r.mask_posted = false;
  // Word by word: inside a string most words are all ones, in structure most are zero. Tokens
  // past the vocabulary's (a model with padded logits) are never allowed.
  const float kOff = -std::numeric_limits<float>::infinity();
  const int32_t n = int32_t(row.size());
  const int32_t vocab = std::min(n, compiler_->vocab().size());
  bool any = false;
  for (int32_t w = 0; w * 64 < vocab; ++w) {
    uint64_t bits = words[size_t(w)];
    const int32_t base = w * 64, end = std::min(vocab, base + 64);
    if (end - base < 64) bits &= (uint64_t{1} << (end - base)) - 1;
    any |= bits != 0;
    if (bits == ~uint64_t{0}) continue;
    for (int32_t t = base; t < end; ++t) {
      if (!((bits >> (t - base)) & 1)) row[size_t(t)] = kOff;
    }
  }
  for (int32_t t = vocab; t < n; ++t) row[size_t(t)] = kOff;
  if (!any) {
    Finish(r, "error", {}, std::string(r.matcher->error().message()));
    return false;
  }
  return true;
}

void EngineImpl::OnToken(Request& r, int32_t token, const float* logits) {
  const ResolvedRequest& p = r.params;
  const absl::Time now = absl::Now();
  if (r.first_token == absl::InfinitePast()) {
    r.first_token = now;
    // The request's first token (its other choices' come in the same step).
    if (options_.observer && r.index == 0) options_.observer->OnFirstToken(Seconds(now - p.arrival));
  } else if (options_.observer) {
    options_.observer->OnInterToken(Seconds(now - r.last_token));
  }
  r.last_token = now;
  if (r.matcher != nullptr) {
    if (absl::Status s = r.matcher->Accept(token); !s.ok()) {
      return Finish(r, "error", {}, std::string(s.message()));
    }
  }
  // End-of-sequence and stop tokens end the request and are not part of its output.
  if (EndsSequence(tokenizer_.get(), model_.config, token) && !p.ignore_eos) {
    return Finish(r, "eos");
  }
  for (int32_t s : p.stop_token_ids) {
    if (token == s) return Finish(r, "stop");
  }
  ++r.completion;
  r.seq.tokens.push_back(token);
  r.sampler->Accept(token);
  if (options_.observer) options_.observer->OnGenerationTokens(1);
  GenerationDelta d;
  d.index = r.index;
  d.token_ids.push_back(token);
  if (p.logprobs) AddLogprobs(r, token, logits, d);
  bool stopped = false;
  d.text = r.text->Push(token, &stopped);
  if (stopped) return Finish(r, "stop", std::move(d));
  // A constraint whose grammar is matched whole: nothing may follow.
  if (r.matcher != nullptr && r.matcher->Complete()) return Finish(r, "stop", std::move(d));
  // The context ends a sequence, unless it streams past it (window, sink: StreamsPastContext).
  if (r.completion >= p.max_new_tokens ||
      (static_cast<int32_t>(r.seq.tokens.size()) >= model_.config.seq_len &&
       !StreamsPastContext(r.seq.kv, 1, model_.config.seq_len))) {
    return Finish(r, "length", std::move(d));
  }
  if (r.prompt_scores != nullptr) d.prompt = std::move(r.prompt_scores);
  r.on_delta(d);
}

void EngineImpl::Loop() {
  cpu::SetNumThreads(options_.threads > 0 ? options_.threads
                                          : static_cast<int>(std::thread::hardware_concurrency()));
  std::vector<SequenceStep> steps;
  std::vector<float> row;
  std::vector<MaskPrefetcher::Job> next_masks;
  while (true) {
    std::deque<std::unique_ptr<Request>> arrived;
    bool force = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(live_.empty() ? 50 : 0), [&] {
        return !incoming_.empty() || stop_ || !live_.empty();
      });
      arrived.swap(incoming_);
      num_live_ += static_cast<int32_t>(arrived.size());
      force = force_cancel_;
      if (stop_ && live_.empty() && arrived.empty()) break;
    }
    for (auto& r : arrived) Admit(std::move(r));

    // Cancellation, deadlines, stalls and forced shutdown free pages before anything is
    // scheduled. A held sequence (its client is not reading) sits out of the batch.
    const absl::Time now = absl::Now();
    for (auto it = live_.begin(); it != live_.end();) {
      Request& r = *it->second;
      const bool expired = r.params.deadline && now > *r.params.deadline;
      r.seq.held = r.held->load();
      if (!r.seq.held) {
        r.held_since = absl::InfiniteFuture();
      } else if (r.held_since == absl::InfiniteFuture()) {
        r.held_since = now;
      }
      const bool stalled = r.seq.held && now - r.held_since > options_.stall_timeout;
      if (force || r.cancelled->load() || expired || stalled) {
        GenerationDelta last;
        if (!force && !r.cancelled->load()) {
          last.status = expired ? DeadlineExceeded() : Stalled(options_.stall_timeout);
        }
        Finish(r, "cancelled", std::move(last));
        it = live_.erase(it);
      } else {
        ++it;
      }
    }
    if (live_.empty()) continue;

    StepPlan plan = scheduler_.Schedule();
    for (Sequence* s : plan.preempted) {
      ++preemptions_;
      live_[s->id]->waiting = true;
      std::lock_guard<std::mutex> lock(mu_);
      ++num_waiting_;
      if (options_.observer) options_.observer->OnPreemption();
    }
    for (Sequence* s : plan.admitted) {
      Request& r = *live_[s->id];
      if (r.admitted == absl::InfinitePast()) {
        r.admitted = absl::Now();
        r.cached_tokens = s->num_computed;  // the scheduler attached its cached prefix
        if (options_.observer) {
          options_.observer->OnQueued(Seconds(r.admitted - r.params.arrival));
          options_.observer->OnPromptTokens(s->num_prompt);
        }
      }
      r.waiting = false;
      std::lock_guard<std::mutex> lock(mu_);
      --num_waiting_;
    }
    if (plan.chunks.empty()) {  // nothing can run (all held, or waiting for pages): wait a bit
      PublishStats();  // holds and releases change what Stats() says without a step
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(2),
                   [&] { return !incoming_.empty() || stop_ || force_cancel_; });
      continue;
    }
    steps.clear();
    std::vector<int64_t> evicted_before;
    // A chunk whose prompt positions are scored returns one row per token, the others one:
    // chunk i's rows start at first_row[i].
    std::vector<size_t> first_row;
    size_t num_rows = 0;
    for (const ScheduledChunk& c : plan.chunks) {
      const PromptScorer* scorer = live_[c.seq->id]->prompt_scorer.get();
      const bool all_logits = scorer != nullptr && scorer->NeedsRows(c.start, c.count);
      steps.push_back(SequenceStep{
          &c.seq->kv, std::span<const int32_t>(c.seq->tokens).subspan(c.start, c.count),
          c.start, all_logits});
      evicted_before.push_back(c.seq->kv.tokens_evicted);
      first_row.push_back(num_rows);
      num_rows += all_logits ? size_t(c.count) : 1;
    }
    // The scheduler planned the pages; they are allocated here, and the runner only uses them.
    const absl::Status applied = ApplyPagePlan(plan, *cache_);
    absl::StatusOr<std::span<const float>> logits =
        applied.ok() ? runner_->Forward(steps) : absl::StatusOr<std::span<const float>>(applied);
    if (options_.observer) options_.observer->OnStep(plan.num_tokens);
    prefetcher_.Wait();  // the masks posted last step, filled during the forward pass
    const int32_t V = model_.config.vocab_size;
    for (size_t i = 0; i < plan.chunks.size(); ++i) {
      const ScheduledChunk& c = plan.chunks[i];
      Request& r = *live_[c.seq->id];
      if (!logits.ok()) {  // the plan was validated and its pages planned: a broken invariant
        Finish(r, "error", {}, std::string(logits.status().message()));
        continue;
      }
      const int64_t evicted = c.seq->kv.tokens_evicted - evicted_before[i];
      tokens_evicted_ += evicted;
      // The base name, not the spec: parameters must not multiply metric label values.
      if (evicted > 0 && options_.observer) {
        options_.observer->OnEvicted(std::string(r.params.kv_policy->name()), evicted);
      }
      c.seq->num_computed += c.count;
      // Prompt blocks finished by this step become reusable (never those of a step that
      // failed, or of a chunk a cancelled request did not finish).
      cache_->RegisterPrefix(c.seq->kv, c.seq->prompt(), c.seq->num_computed);
      if (r.prompt_scorer != nullptr) ScorePrompt(r, c, logits->subspan(first_row[i] * V));
      if (!c.samples) continue;
      if (r.params.max_new_tokens == 0) {  // it scores its prompt alone: done after it
        Finish(r, "length");
        continue;
      }
      // The chunk's last row gives the next token.
      const size_t last_row = first_row[i] + (steps[i].all_logits ? size_t(c.count) - 1 : 0);
      const float* lrow = logits->data() + last_row * V;
      if (r.group != nullptr && !r.group->forked) {
        // The prompt's logits: every choice samples its first token from them.
        for (Request* choice : ForkChoices(r)) SampleInto(*choice, lrow, row, next_masks);
      } else {
        SampleInto(r, lrow, row, next_masks);
      }
    }
    // Posted once every token is accepted, so the prefetcher never holds up an Accept of the
    // same automaton; they are filled while the next forward pass runs.
    for (MaskPrefetcher::Job& job : next_masks) prefetcher_.Post(std::move(job));
    next_masks.clear();
    if (forked_groups_ > 0) MeasureGroupPages();
    DropFinished();
    PublishStats();
  }
}

void EngineImpl::SampleInto(Request& r, const float* lrow, std::vector<float>& row,
                            std::vector<MaskPrefetcher::Job>& next_masks) {
  row.assign(lrow, lrow + model_.config.vocab_size);
  if (r.matcher != nullptr && r.matcher->active() && !ApplyConstraint(r, row)) return;
  OnToken(r, r.sampler->Sample(row), lrow);
  if (r.matcher != nullptr && !r.done && r.matcher->active()) {
    r.mask_posted = true;
    next_masks.push_back({r.matcher, r.mask});
  }
}

std::vector<Request*> EngineImpl::ForkChoices(Request& parent) {
  ChoiceGroup& g = *parent.group;
  g.forked = true;
  g.unfinished = g.n;
  ++forked_groups_;
  std::vector<Request*> choices{&parent};
  for (int32_t i = 1; i < g.n; ++i) {
    auto child = std::make_unique<Request>();
    Request& c = *child;
    c.arrival = parent.arrival;
    c.params = parent.params;
    c.params.sampling.seed = ChoiceSeed(parent.params.sampling.seed, i);
    InitSequence(c);  // the prompt's scores are choice 0's alone: no scorer
    if (parent.matcher != nullptr) {  // its state before the first token: choice 0's now
      c.matcher = std::make_shared<grammar::ConstraintMatcher>(*parent.matcher);
      c.mask = std::make_shared<std::vector<uint64_t>>(parent.mask->size());
    }
    c.on_delta = parent.on_delta;  // forwards to the group's callback
    c.cancelled = parent.cancelled;
    c.held = parent.held;
    c.admitted = parent.admitted;
    c.group = parent.group;
    c.index = i;
    // Before any choice's first token is accepted: one may end at once and release its pages.
    c.waiting = !scheduler_.Fork(parent.seq, &c.seq);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++num_live_;
      if (c.waiting) ++num_waiting_;
    }
    choices.push_back(&c);
    live_.emplace(c.seq.id, std::move(child));
  }
  return choices;
}

void EngineImpl::MeasureGroupPages() {
  // The distinct pages each forked group's choices hold (shared ones once), measured again
  // whenever the pages they hold, summed, have changed.
  std::map<ChoiceGroup*, std::vector<const Request*>> groups;
  for (const auto& [id, r] : live_) {
    if (r->group != nullptr && r->group->forked && !r->done) groups[r->group.get()].push_back(r.get());
  }
  std::vector<int32_t> pages;
  for (auto& [g, members] : groups) {
    int64_t sum = 0;
    for (const Request* r : members) sum += r->seq.kv.NumPages();
    if (sum == g->counted_pages) continue;
    g->counted_pages = sum;
    pages.clear();
    for (const Request* r : members) {
      for (const KvTable& t : r->seq.kv.tables) pages.insert(pages.end(), t.pages.begin(), t.pages.end());
      for (const KvTable& t : r->seq.kv.demoted) pages.insert(pages.end(), t.pages.begin(), t.pages.end());
    }
    std::sort(pages.begin(), pages.end());
    const int64_t distinct = std::unique(pages.begin(), pages.end()) - pages.begin();
    g->peak_pages = std::max(g->peak_pages, static_cast<int32_t>(distinct));
  }
}

void EngineImpl::PublishStats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.pages_total = cache_->allocator().num_pages_total();
  stats_.cached_pages = cache_->CachedPages();
  // Pages sequences hold: their own, and cached prefix pages they share (counted once).
  stats_.pages_used = cache_->allocator().num_pages_used() - stats_.cached_pages +
                      cache_->SharedCachedPages();
  const PrefixStats& prefix = cache_->prefix_stats();
  stats_.prefix_lookups = prefix.lookups;
  stats_.prefix_hits = prefix.hits;
  stats_.prefix_hit_tokens = prefix.hit_tokens;
  stats_.prefix_reclaimed_pages = prefix.reclaimed_pages;
  // Of those, the packed ones (issue 29): demoted stores, and requests' own K/V types.
  stats_.pages_demoted = stats_.pages_packed = 0;
  stats_.sequences_held = 0;
  for (const auto& [id, r] : live_) {
    stats_.sequences_held += r->seq.held ? 1 : 0;
    const SequenceKv& kv = r->seq.kv;
    for (const KvTable& t : kv.demoted) stats_.pages_demoted += int32_t(t.pages.size());
    if (kv.quant != KvQuant::kNone) {
      for (const KvTable& t : kv.tables) stats_.pages_packed += int32_t(t.pages.size());
    }
  }
  stats_.sequences_running = scheduler_.num_running();
  stats_.tokens_evicted = tokens_evicted_;
  stats_.preemptions = preemptions_;
}

}  // namespace

uint64_t ChoiceSeed(uint64_t seed, int32_t index) {
  if (index == 0) return seed;
  uint64_t z = seed + uint64_t(index) * 0x9E3779B97F4A7C15ull;  // SplitMix64 (Vigna)
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(Model model,
                                                       std::shared_ptr<const TextTokenizer> tokenizer,
                                                       const EngineOptions& options) {
  if (options.num_pages <= 0) return absl::InvalidArgumentError("the KV pool needs pages");
  if (options.max_step_tokens <= 0 || options.max_running <= 0 || options.max_waiting < 0) {
    return absl::InvalidArgumentError(
        "max step tokens and max running sequences must be positive, the queue limit >= 0");
  }
  if (absl::Status s = ValidateDefaults(options); !s.ok()) return s;
  absl::StatusOr<Device> device = ParseDevice(options.device);
  if (!device.ok()) return device.status();
  absl::StatusOr<KvDtype> kv_dtype = ResolveKvDtype(*device, options.kv_dtype);
  if (!kv_dtype.ok()) return kv_dtype.status();
  absl::StatusOr<std::unique_ptr<KvCache>> cache = CreateKvCache(
      *device, KvShapeForDevice(*device, model.config, options.block_size, *kv_dtype),
      options.num_pages);
  if (!cache.ok()) return cache.status();
  // Prefix caching needs the host layout; on a GPU it is off (docs/ARCHITECTURE.md).
  if (options.prefix_cache && (*cache)->SupportsPrefixCache()) {
    PrefixCacheOptions prefix;
    prefix.chunk_grid = PrefillChunk(options);
    if (absl::Status s = (*cache)->EnablePrefixCache(prefix); !s.ok()) return s;
  }
  auto held = std::make_unique<Model>(std::move(model));
  absl::StatusOr<std::unique_ptr<StepRunner>> runner =
      MakeStepRunner(*device, *held, cache->get(), {.gpu_weights = options.gpu_weights});
  if (!runner.ok()) return runner.status();
  return std::unique_ptr<Engine>(new EngineImpl(std::move(held), std::move(tokenizer), options,
                                                *std::move(cache), *std::move(runner)));
}

}  // namespace heavykv
