// The serving engine end to end, in process: continuous batching gives every request the text it
// would get alone, cancellation and deadlines free pages, bad requests are refused with clear
// errors, a full queue is refused, full-cache sequences that outgrow the pool are preempted and
// recomputed, and h2o budgets let more sequences run at once.
#include "engine/serving/engine.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <fstream>
#include <functional>
#include <limits>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "engine/grammar/constraint.h"
#include "engine/runner/model_runner.h"
#include "engine/serving/generator.h"
#include "engine/serving/request_field.h"
#include "engine/serving/request_validation.h"
#include "engine/tokenizer/tokenizer.h"
#include "kernels/cpu/gemm.h"
#include "tests/test_util.h"

namespace heavykv {
namespace {

// The bundled model's layers: a CPU page holds one layer, so a pool of N pages "of every layer"
// is N * kLayers pages here.
constexpr int32_t kLayers = 5;

// Gathers one request's deltas; Wait() blocks until the finished one.
struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<GenerationDelta> deltas;
  bool finished = false;
  GenerationDelta last;

  std::function<void(const GenerationDelta&)> Callback() {
    return [this](const GenerationDelta& d) {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_FALSE(finished) << "a delta after the finished one";
      deltas.push_back(d);
      tokens.insert(tokens.end(), d.token_ids.begin(), d.token_ids.end());
      text += d.text;
      if (d.finished) {
        finished = true;
        last = d;
      }
      cv.notify_all();
    };
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return finished; }));
  }
  void WaitForTokens(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60),
                            [&] { return tokens.size() >= n || finished; }));
  }
};

class EngineTest : public ::testing::Test {
 protected:
  std::unique_ptr<Engine> Make(int32_t pages, int32_t max_running = 64, int32_t max_waiting = 256,
                               int32_t max_step_tokens = 512, double overcommit = 1.0,
                               bool prefix_cache = true, bool share_tenants = false) {
    EngineOptions o;
    o.prefix_cache = prefix_cache;
    o.prefix_cache_share_tenants = share_tenants;
    o.full_overcommit = overcommit;
    o.num_pages = pages * kLayers;  // `pages` of every layer
    o.max_running = max_running;
    o.max_waiting = max_waiting;
    o.max_step_tokens = max_step_tokens;
    o.stall_timeout = stall_timeout_;
    o.threads = 1;
    auto e = Engine::Create(*LoadModel(testing::ModelPath()),
                            std::make_shared<Tokenizer>(*Tokenizer::Load(testing::TokenizerPath(), 512)), o);
    EXPECT_TRUE(e.ok()) << e.status();
    return *std::move(e);
  }
  absl::Duration stall_timeout_ = absl::Seconds(30);

  static GenerationRequest Greedy(std::string prompt, int32_t max_new) {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.max_new_tokens = max_new;
    r.temperature = 0.0f;
    return r;
  }
  // What `heavykv run` prints for the same greedy request (without its final newline).
  static std::string Alone(const std::string& prompt, int32_t max_new, const std::string& policy,
                           int32_t budget, KvQuant quant = KvQuant::kNone) {
    Model m = *LoadModel(testing::ModelPath());
    Tokenizer tok = *Tokenizer::Load(testing::TokenizerPath(), 512);
    auto cache = *KvCache::Create(KvShapeFor(m.config, 16), 64 * kLayers);
    ModelRunner runner(m, cache.get());
    std::vector<int32_t> ids = tok.Encode(prompt, true, false);
    auto p = *MakePolicy(policy);
    GenerateOptions opt;
    opt.steps = static_cast<int32_t>(ids.size()) + max_new - 1;
    opt.sampling.temperature = 0;
    opt.policy = policy == "full" ? nullptr : p.get();
    opt.budget = budget;
    opt.kv_quant = quant;
    std::string text;
    int32_t n = 0;
    auto r = Generate(runner, ids, opt, [&](int32_t prev, int32_t t) {
      if (++n < static_cast<int32_t>(ids.size())) return;  // the echoed prompt
      std::string piece = tok.Decode(prev, t);
      if (Tokenizer::IsPrintablePiece(piece)) text += piece;
    });
    EXPECT_TRUE(r.ok());
    return text;
  }
};

TEST_F(EngineTest, GreedyStreamEqualsLlama2cReference) {
  auto engine = Make(64);
  GenerationRequest r;
  r.prompt_token_ids = {1};
  r.max_new_tokens = 256;
  r.temperature = 0.0f;
  Collector c;
  ASSERT_TRUE(engine->Submit(r, c.Callback()).ok());
  c.Wait();
  std::ifstream in(testing::SourcePath("tests/data/stories260K.greedy.txt"));
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(c.text + "\n", ss.str());
  EXPECT_EQ(c.last.finish_reason, "length");
  EXPECT_EQ(c.last.usage.completion_tokens, 256);
  EXPECT_EQ(c.last.usage.prompt_tokens, 1);
  EXPECT_GT(c.deltas.size(), 200u);  // streamed, not delivered at the end
  EXPECT_EQ(engine->Stats().pages_used, 0);
}

// --kv-dtype bf16 on the CPU: a pool of the same page count holds pages of half the K/V bytes;
// the greedy text of the bundled model is unchanged by the rounding (measured: all 256 tokens);
// an unknown dtype is INVALID_ARGUMENT at start-up.
TEST_F(EngineTest, Bf16KvServesAndUnknownDtypeIsRejected) {
  EngineOptions o;
  o.num_pages = 64 * kLayers;
  o.threads = 1;
  o.kv_dtype = "bf16";
  auto engine = Engine::Create(*LoadModel(testing::ModelPath()),
                               std::make_shared<Tokenizer>(*Tokenizer::Load(testing::TokenizerPath(), 512)), o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  GenerationRequest r;
  r.prompt_token_ids = {1};
  r.max_new_tokens = 256;
  r.temperature = 0.0f;
  Collector c;
  ASSERT_TRUE((*engine)->Submit(r, c.Callback()).ok());
  c.Wait();
  std::ifstream in(testing::SourcePath("tests/data/stories260K.greedy.txt"));
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(c.text + "\n", ss.str());
  EXPECT_EQ((*engine)->Stats().pages_used, 0);
  o.kv_dtype = "fp16";
  auto bad = Engine::Create(*LoadModel(testing::ModelPath()),
                            std::make_shared<Tokenizer>(*Tokenizer::Load(testing::TokenizerPath(), 512)), o);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

// --kv-dtype int8 / int4 (issue 29): every policy (page granularity and layer budgets included)
// runs on quantized pages at once, past its budget, and gives every page back; a sink stream
// runs past the 512-token context (re-rotating its quantized pinned keys); GetCacheStats names
// the dtype and its real bytes per token.
TEST_F(EngineTest, QuantizedKvServesEveryPolicy) {
  for (const char* dtype : {"int8", "int4"}) {
    SCOPED_TRACE(dtype);
    EngineOptions o;
    o.num_pages = 256 * kLayers;
    o.threads = 1;
    o.kv_dtype = dtype;
    o.max_new_tokens_limit = 1024;  // the sink stream runs past the context
    auto engine = Engine::Create(
        *LoadModel(testing::ModelPath()),
        std::make_shared<Tokenizer>(*Tokenizer::Load(testing::TokenizerPath(), 512)), o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    const std::string policies[] = {"full", "h2o", "window", "sink", "tova", "scissorhands",
                                    "knorm", "snapkv:window=8:kernel=3", "h2o:granularity=page",
                                    "h2o:layers=pyramid", "h2o:layers=squeeze"};
    std::vector<std::unique_ptr<Collector>> cs;
    for (const std::string& p : policies) {
      GenerationRequest r = Greedy("Once upon a time", 96);
      r.ignore_eos = true;
      r.policy = p;
      r.budget_tokens = 24;
      cs.push_back(std::make_unique<Collector>());
      ASSERT_TRUE((*engine)->Submit(r, cs.back()->Callback()).ok()) << p;
    }
    GenerationRequest stream = Greedy("Once upon a time", 600);  // past the context of 512
    stream.ignore_eos = true;
    stream.policy = "sink";
    stream.budget_tokens = 64;
    cs.push_back(std::make_unique<Collector>());
    ASSERT_TRUE((*engine)->Submit(stream, cs.back()->Callback()).ok());
    for (size_t i = 0; i < cs.size(); ++i) {
      cs[i]->Wait();
      EXPECT_TRUE(cs[i]->last.status.ok()) << i << ": " << cs[i]->last.status;
      EXPECT_EQ(cs[i]->tokens.size(), i + 1 < cs.size() ? 96u : 600u) << i;
      EXPECT_FALSE(cs[i]->text.empty()) << i;
    }
    // A demoted store no narrower than the pool's pages saves nothing: refused before it runs
    // (on this head_dim of 8 an int4 slot with its pos and score takes 20 bytes, an int8 one
    // 18): at Submit for token ids, as a "rejected" last delta for a text prompt.
    GenerationRequest demote = Greedy("Once upon a time", 8);
    demote.policy = "h2o:demote=int4";
    demote.budget_tokens = 24;
    Collector refused;
    ASSERT_TRUE((*engine)->Submit(demote, refused.Callback()).ok());
    refused.Wait();
    EXPECT_EQ(refused.last.finish_reason, "rejected");
    EXPECT_EQ(refused.last.status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(refused.last.status.message().find("narrower"), std::string::npos)
        << refused.last.status;
    demote.prompt.reset();
    demote.prompt_token_ids = {1, 403, 407};
    const absl::StatusOr<std::shared_ptr<RequestHandle>> no =
        (*engine)->Submit(demote, refused.Callback());
    EXPECT_EQ(no.status().code(), absl::StatusCode::kInvalidArgument) << no.status();
    const CacheStats st = (*engine)->Stats();
    EXPECT_EQ(st.pages_used, 0);
    EXPECT_EQ(st.kv_dtype, dtype);
    // 5 layers x 4 kv heads x (2 x (8 + scale) + 8): int8 a 1-byte scale, int4 4 bytes of data
    // and one fp16 scale (a group of 8).
    EXPECT_EQ(st.bytes_per_token, std::string(dtype) == "int8" ? 20 * 26 : 20 * 20);
  }
}

// kv_dtype per request (issue 29): on one fp32 pool, requests asking for int8 and int4 rows run
// on packed pages beside fp32 ones, each generating what it generates alone with that type;
// usage names the type; pages all come back; a type that saves nothing is refused.
TEST_F(EngineTest, RequestsChooseTheirOwnKvDtype) {
  auto engine = Make(256, 64, 256, 128);
  const std::vector<std::string> prompts = {"Once upon a time", "Lily had a red ball",
                                            "The cat sat"};
  struct Ask {
    const char* dtype;
    KvQuant quant;
    const char* policy;
  };
  const Ask asks[] = {{"int8", KvQuant::kInt8, "full"},  {"int4", KvQuant::kInt4, "h2o"},
                      {"auto", KvQuant::kNone, "h2o"},   {"int8", KvQuant::kInt8, "h2o:demote=int4"},
                      {"int4", KvQuant::kInt4, "window"}, {"fp32", KvQuant::kNone, "sink"},
                      {"int8", KvQuant::kInt8, "snapkv:window=8:kernel=3"}};
  std::vector<std::unique_ptr<Collector>> cs;
  std::vector<std::string> expect;
  int i = 0;
  for (const Ask& a : asks) {
    const std::string& p = prompts[i % prompts.size()];
    GenerationRequest r = Greedy(p, 60 + 5 * i);
    r.kv_dtype = a.dtype;
    r.policy = a.policy;
    const bool full = std::string(a.policy) == "full";
    if (!full) r.budget_tokens = 24;
    cs.push_back(std::make_unique<Collector>());
    ASSERT_TRUE(engine->Submit(r, cs.back()->Callback()).ok()) << a.dtype << " " << a.policy;
    expect.push_back(Alone(p, 60 + 5 * i, a.policy, full ? kUnboundedBudget : 24, a.quant));
    ++i;
  }
  for (size_t k = 0; k < cs.size(); ++k) {
    cs[k]->Wait();
    EXPECT_EQ(cs[k]->text, expect[k]) << "request " << k;
    const std::string want = asks[k].quant == KvQuant::kInt8   ? "int8"
                             : asks[k].quant == KvQuant::kInt4 ? "int4"
                                                               : "fp32";
    EXPECT_EQ(cs[k]->last.usage.kv_dtype, want) << "request " << k;
  }
  // The packed types are not fp32 under another name.
  EXPECT_NE(expect[1], Alone(prompts[1], 65, "h2o", 24));
  EXPECT_EQ(engine->Stats().pages_used, 0);
  GenerationRequest bad = Greedy("x", 4);
  bad.prompt.reset();
  bad.prompt_token_ids = {1, 403, 407};
  for (const char* dtype : {"fp16", "bf16"}) {  // unknown; not the pool's and not narrower
    bad.kv_dtype = dtype;
    Collector c;
    EXPECT_EQ(engine->Submit(bad, c.Callback()).status().code(),
              absl::StatusCode::kInvalidArgument) << dtype;
  }
  bad.kv_dtype = "int8";
  bad.policy = "h2o:demote=int8";  // a store as wide as the rows
  bad.budget_tokens = 2;
  Collector c;
  const auto refused = engine->Submit(bad, c.Callback());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("narrower"), std::string::npos) << refused.status();
}

// GetCacheStats and the metrics count the packed pages: a request with its own int8 rows and an
// int4 demoted store, observed from its own stream (the snapshot published after the step
// before each token: deterministic, read on the engine thread), then nothing once it is done.
TEST_F(EngineTest, StatsCountDemotedAndPackedPages) {
  auto engine = Make(64);
  GenerationRequest r = Greedy("Once upon a time", 120);
  r.ignore_eos = true;
  r.policy = "h2o:demote=int4:demote_budget=60";
  r.budget_tokens = 24;
  r.kv_dtype = "int8";
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  int tokens = 0;
  CacheStats late;
  Engine* e = engine.get();
  ASSERT_TRUE(engine
                  ->Submit(r,
                           [&](const GenerationDelta& d) {
                             std::lock_guard<std::mutex> lock(mu);
                             tokens += static_cast<int>(d.token_ids.size());
                             if (tokens == 100) late = e->Stats();
                             if (d.finished) {
                               done = true;
                               cv.notify_all();
                             }
                           })
                  .ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return done; }));
  }
  // Over 100 tokens in: 24 kept in int8 pages of 36 slots, the store full at 60 in int4 pages
  // of 48: one packed page and two demoted pages a layer, five layers.
  EXPECT_EQ(late.pages_packed, 5 * 1);
  EXPECT_EQ(late.pages_demoted, 5 * 2);
  EXPECT_GE(late.pages_used, late.pages_packed + late.pages_demoted);
  const CacheStats after = engine->Stats();
  EXPECT_EQ(after.pages_used, 0);
  EXPECT_EQ(after.pages_packed, 0);
  EXPECT_EQ(after.pages_demoted, 0);
}

TEST_F(EngineTest, ConcurrentStreamsEachEqualTheirSequentialRun) {
  auto engine = Make(256, 64, 256, 128);
  const std::vector<std::string> prompts = {"Once upon a time", "Lily had a red ball",
                                            "The cat sat", "Tom and Sue went to the park",
                                            "One day", "A little bird"};
  const std::string policies[] = {"full",  "h2o",          "window", "sink",
                                  "tova",  "scissorhands", "knorm",  "snapkv:window=8:kernel=3",
                                  "h2o:granularity=page", "window:granularity=page",
                                  "h2o:demote=int4", "tova:demote=int8:demote_budget=10"};
  constexpr int kNumPolicies = sizeof(policies) / sizeof(policies[0]);
  std::vector<std::unique_ptr<Collector>> cs;
  std::vector<std::string> expect;
  for (int i = 0; i < 16; ++i) {
    const std::string& p = prompts[i % prompts.size()];
    const std::string& pol = policies[i % kNumPolicies];
    GenerationRequest r = Greedy(p, 40 + 7 * i);
    if (pol != "full") {
      r.policy = pol;
      r.budget_tokens = 24;
    }
    cs.push_back(std::make_unique<Collector>());
    ASSERT_TRUE(engine->Submit(r, cs.back()->Callback()).ok());
    expect.push_back(Alone(p, 40 + 7 * i, pol, pol == "full" ? kUnboundedBudget : 24));
  }
  for (size_t i = 0; i < cs.size(); ++i) {
    cs[i]->Wait();
    EXPECT_EQ(cs[i]->text, expect[i]) << "request " << i;
  }
  EXPECT_EQ(engine->Stats().pages_used, 0);
}

// Policy specs through the engine: parameters are accepted, bad ones refused at submission, and
// the eviction metric is labelled by the base name only (no label value per parameter set).
TEST_F(EngineTest, PolicySpecsAndTheirMetricLabel) {
  struct Labels : EngineObserver {
    std::mutex mu;
    std::set<std::string> seen;
    void OnEvicted(const std::string& policy, int64_t) override {
      std::lock_guard<std::mutex> lock(mu);
      seen.insert(policy);
    }
  } labels;
  EngineOptions o;
  o.num_pages = 64 * kLayers;
  o.threads = 1;
  o.observer = &labels;
  auto engine = *Engine::Create(
      *LoadModel(testing::ModelPath()),
      std::make_shared<Tokenizer>(*Tokenizer::Load(testing::TokenizerPath(), 512)), o);
  GenerationRequest r = Greedy("Once upon a time", 40);
  r.policy = "scissorhands:history=50";
  r.budget_tokens = 16;
  Collector c;
  ASSERT_TRUE(engine->Submit(r, c.Callback()).ok());
  c.Wait();
  EXPECT_EQ(c.last.usage.policy, "scissorhands:history=50");
  {
    std::lock_guard<std::mutex> lock(labels.mu);
    EXPECT_EQ(labels.seen, (std::set<std::string>{"scissorhands"}));
  }
  r.policy = "snapkv:kernel=4";
  absl::StatusOr<std::shared_ptr<RequestHandle>> bad = engine->Submit(r, c.Callback());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("snapkv:kernel=4"), std::string::npos) << bad.status();
  r.policy = "h2o:demote=int2";
  bad = engine->Submit(r, c.Callback());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("demote=int8|int4"), std::string::npos) << bad.status();
  r.policy = "lru";
  bad = engine->Submit(r, c.Callback());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown KV policy"), std::string::npos) << bad.status();
}

// serve --evict-granularity page: requests whose spec names no granularity evict by page, and
// generate what the same policy does alone; a spec's own granularity=token overrides it.
TEST_F(EngineTest, EvictGranularityOptionIsTheDefaultOfRequests) {
  EngineOptions o;
  o.num_pages = 64 * kLayers;
  o.threads = 1;
  o.evict_granularity = EvictGranularity::kPage;
  auto engine = *Engine::Create(
      *LoadModel(testing::ModelPath()),
      std::make_shared<Tokenizer>(*Tokenizer::Load(testing::TokenizerPath(), 512)), o);
  for (const char* policy : {"h2o", "window:granularity=token"}) {
    SCOPED_TRACE(policy);
    GenerationRequest r = Greedy("Once upon a time", 90);
    r.policy = policy;
    r.budget_tokens = 20;
    Collector c;
    ASSERT_TRUE(engine->Submit(r, c.Callback()).ok());
    c.Wait();
    const std::string alone = std::string(policy) == "h2o" ? "h2o:granularity=page" : policy;
    EXPECT_EQ(c.text, Alone("Once upon a time", 90, alone, 20));
    EXPECT_NE(c.text, std::string(policy) == "h2o" ? Alone("Once upon a time", 90, "h2o", 20)
                                                   : std::string());
  }
  EXPECT_EQ(engine->Stats().pages_used, 0);
  GenerationRequest bad = Greedy("Once upon a time", 8);
  bad.policy = "h2o:granularity=pages";
  Collector c;
  absl::StatusOr<std::shared_ptr<RequestHandle>> refused = engine->Submit(bad, c.Callback());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(EngineTest, CancelAndDeadlineReturnPages) {
  auto engine = Make(64);
  Collector a, b;
  // Both requests run past the model's end of story (ignore_eos), so only the cancel or the
  // deadline can end them: greedily the bundled model ends its story after 341 tokens, about
  // 25 ms on a fast core, which once beat a 30 ms deadline.
  GenerationRequest long_one = Greedy("Once upon a time", 400);
  long_one.ignore_eos = true;
  auto handle = engine->Submit(long_one, a.Callback());
  ASSERT_TRUE(handle.ok());
  a.WaitForTokens(5);
  (*handle)->Cancel();
  a.Wait();
  EXPECT_EQ(a.last.finish_reason, "cancelled");
  EXPECT_TRUE(a.last.status.ok()) << a.last.status;  // the client's cancel: nothing to report
  EXPECT_LT(a.tokens.size(), 400u);
  GenerationRequest r = long_one;
  r.deadline = absl::Now() + absl::Milliseconds(5);  // 400 tokens take several times that
  ASSERT_TRUE(engine->Submit(r, b.Callback()).ok());
  b.Wait();
  EXPECT_EQ(b.last.finish_reason, "cancelled");
  EXPECT_EQ(b.last.status.code(), absl::StatusCode::kDeadlineExceeded) << b.last.status;
  EXPECT_EQ(engine->Stats().pages_used, 0);
  // The engine still serves.
  Collector c;
  ASSERT_TRUE(engine->Submit(Greedy("One day", 8), c.Callback()).ok());
  c.Wait();
  EXPECT_EQ(c.last.finish_reason, "length");
}

// Backpressure (RequestHandle::Hold, issue 41): a request held from its own callback, as the
// fronts hold it, makes no progress while held, does not keep others from running (even with
// max_running 1: a held sequence takes no batch slot), and once released ends with the text it
// would have had alone. Held past the stall timeout, it is cancelled with DEADLINE_EXCEEDED and
// its pages are freed.
TEST_F(EngineTest, HeldRequestsPauseThenResumeAndStalledOnesAreCancelled) {
  stall_timeout_ = absl::Milliseconds(400);
  auto engine = Make(64, /*max_running=*/1);
  GenerationRequest r = Greedy("Once upon a time", 120);
  r.ignore_eos = true;
  struct Holder {
    std::mutex mu;
    std::shared_ptr<RequestHandle> handle;
    size_t tokens = 0;
    bool held = false;
  };
  const auto hold_after = [](Holder& h, Collector& c, size_t n) {
    auto inner = c.Callback();
    // The holder's part first: once the collector has the finished delta, the test may end
    // and `h` with it.
    return [&h, inner, n](const GenerationDelta& d) {
      {
        std::lock_guard<std::mutex> lock(h.mu);
        h.tokens += d.token_ids.size();
        if (!h.held && h.tokens >= n && h.handle != nullptr) {
          h.held = true;
          h.handle->Hold(true);  // on the engine thread, from the callback
        }
      }
      inner(d);
    };
  };
  Holder ha;
  Collector a;
  auto handle = engine->Submit(r, hold_after(ha, a, 10));
  ASSERT_TRUE(handle.ok());
  const auto set_handle = [](Holder& h, std::shared_ptr<RequestHandle> handle, size_t n) {
    std::lock_guard<std::mutex> lock(h.mu);
    h.handle = std::move(handle);
    if (!h.held && h.tokens >= n) {  // it got there before its handle was known
      h.held = true;
      h.handle->Hold(true);
    }
  };
  set_handle(ha, *handle, 10);
  a.WaitForTokens(10);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a step in flight ends
  size_t at_hold;
  {
    std::lock_guard<std::mutex> lock(a.mu);
    at_hold = a.tokens.size();
    ASSERT_FALSE(a.finished);
  }
  // Another request runs to its end while `a` is held, though max_running is 1.
  Collector b;
  ASSERT_TRUE(engine->Submit(Greedy("One day", 20), b.Callback()).ok());
  b.Wait();
  EXPECT_EQ(b.last.finish_reason, "length");
  {
    std::lock_guard<std::mutex> lock(a.mu);
    EXPECT_EQ(a.tokens.size(), at_hold) << "a held request made progress";
    EXPECT_FALSE(a.finished);
  }
  EXPECT_GT(engine->Stats().pages_used, 0);  // its pages are kept
  (*handle)->Hold(false);
  a.Wait();
  EXPECT_EQ(a.last.finish_reason, "length");
  EXPECT_EQ(a.tokens.size(), 120u);
  EXPECT_EQ(a.text, Alone("Once upon a time", 120, "full", 0));
  EXPECT_EQ(engine->Stats().pages_used, 0);

  // Held and never released: cancelled after the stall timeout, pages freed.
  Holder hc;
  Collector c;
  auto stalled = engine->Submit(r, hold_after(hc, c, 5));
  ASSERT_TRUE(stalled.ok());
  set_handle(hc, *stalled, 5);
  c.Wait();
  EXPECT_EQ(c.last.finish_reason, "cancelled");
  EXPECT_EQ(c.last.status.code(), absl::StatusCode::kDeadlineExceeded) << c.last.status;
  EXPECT_NE(c.last.status.message().find("read nothing"), std::string::npos) << c.last.status;
  EXPECT_LT(c.tokens.size(), 120u);
  EXPECT_EQ(engine->Stats().pages_used, 0);
}

TEST_F(EngineTest, BadRequestsAreInvalidArgumentAndOthersAreServed) {
  auto engine = Make(64);
  Collector ok;
  ASSERT_TRUE(engine->Submit(Greedy("Once upon a time", 100), ok.Callback()).ok());
  // Refused by Submit itself (no tokens needed to tell), or, for a text prompt whose token count
  // is at fault, accepted and then ended by a "rejected" delta carrying the status.
  auto bad = [&](GenerationRequest r, const std::string& words, bool after_tokenizing = false) {
    Collector c;
    absl::StatusOr<std::shared_ptr<RequestHandle>> s = engine->Submit(r, c.Callback());
    absl::Status status = s.status();
    if (after_tokenizing) {
      ASSERT_TRUE(s.ok()) << words << ": " << s.status();
      c.Wait();
      EXPECT_EQ(c.last.finish_reason, "rejected");
      EXPECT_EQ(c.deltas.size(), 1u);
      status = c.last.status;
    }
    ASSERT_FALSE(status.ok()) << words;
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
    EXPECT_NE(status.message().find(words), absl::string_view::npos) << status;
  };
  bad(Greedy("", 10), "empty");
  GenerationRequest none;
  none.max_new_tokens = 5;
  bad(none, "no prompt");
  bad(Greedy("hi", 0), "max_new_tokens");
  bad(Greedy("hi", 600), "max_new_tokens");
  GenerationRequest t = Greedy("hi", 5);
  t.temperature = -1.0f;
  bad(t, "temperature");
  t = Greedy("hi", 5);
  t.top_p = 1.5f;
  bad(t, "top_p");
  t = Greedy("hi", 5);
  t.top_k = -2;
  bad(t, "top_k");
  t = Greedy("hi", 5);
  t.policy = "lru";
  bad(t, "unknown KV policy");
  t = Greedy("hi", 5);
  t.budget_fraction = 1.5;
  bad(t, "budget_fraction");
  GenerationRequest ids;
  ids.prompt_token_ids = {1, 512};
  ids.max_new_tokens = 5;
  bad(ids, "outside the vocabulary");
  bad(Greedy(std::string("caf\xC3", 4), 5), "UTF-8");
  bad(Greedy(std::string(3000, 'a'), 5), "prompt has", /*after_tokenizing=*/true);
  bad(Greedy(std::string(1 << 20, 'a'), 5), "bytes");  // over the byte limit: never tokenized
  t = Greedy("hi", 5);
  t.request_id = std::string(257, 'x');
  bad(t, "request_id");
  t = Greedy("hi", 5);
  t.stop = std::vector<std::string>(33, "x");
  bad(t, "stop strings");
  t = Greedy("hi", 5);
  t.stop = {std::string(257, 'x')};
  bad(t, "stop string has");
  t = Greedy("hi", 5);
  t.stop_token_ids = std::vector<int32_t>(257, 5);
  bad(t, "stop token ids");
  t = Greedy("hi", 5);
  t.policy = std::string(100000, 'p') + "\n\x1b[31m";
  Collector c;
  absl::Status long_policy = engine->Submit(t, c.Callback()).status();
  EXPECT_TRUE(absl::IsInvalidArgument(long_policy));
  EXPECT_LT(long_policy.message().size(), 200u) << "the message echoes a short prefix only";
  ok.Wait();
  EXPECT_EQ(ok.last.finish_reason, "length");
  EXPECT_EQ(ok.last.usage.completion_tokens, 100);
  EXPECT_EQ(engine->Stats().pages_used, 0);
}

TEST_F(EngineTest, FullQueueIsResourceExhausted) {
  auto engine = Make(64, /*max_running=*/1, /*max_waiting=*/1);
  Collector a, b, c;
  ASSERT_TRUE(engine->Submit(Greedy("Once upon a time", 300), a.Callback()).ok());
  a.WaitForTokens(1);  // running: the queue is empty again
  ASSERT_TRUE(engine->Submit(Greedy("One day", 5), b.Callback()).ok());  // waits
  auto s = engine->Submit(Greedy("One day", 5), c.Callback());
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(s.status())) << s.status();
  a.Wait();
  b.Wait();
  EXPECT_EQ(b.last.finish_reason, "length");
  EXPECT_EQ(engine->Stats().pages_used, 0);
}

TEST_F(EngineTest, FullCacheSequencesOutgrowingThePoolArePreemptedAndRecomputed) {
  // 16 pages = 256 slots; each request grows to 5 + 150 tokens = 10 pages: two cannot coexist,
  // but an overcommitting server admits them on their first chunk.
  auto engine = Make(16, 64, 256, 512, /*overcommit=*/4.0);
  std::vector<std::unique_ptr<Collector>> cs;
  const std::vector<std::string> prompts = {"Once upon", "Lily had", "The cat sat"};
  for (const std::string& p : prompts) {
    cs.push_back(std::make_unique<Collector>());
    ASSERT_TRUE(engine->Submit(Greedy(p, 150), cs.back()->Callback()).ok());
  }
  for (size_t i = 0; i < cs.size(); ++i) {
    cs[i]->Wait();
    EXPECT_EQ(cs[i]->last.finish_reason, "length");
    EXPECT_EQ(cs[i]->text, Alone(prompts[i], 150, "full", kUnboundedBudget)) << i;
  }
  EXPECT_GT(engine->Stats().preemptions, 0);
  EXPECT_EQ(engine->Stats().pages_used, 0);
}

TEST_F(EngineTest, WithoutOvercommitFullCacheSequencesWaitInsteadOfPreempting) {
  auto engine = Make(16);
  std::vector<std::unique_ptr<Collector>> cs;
  for (const char* p : {"Once upon", "Lily had", "The cat sat"}) {
    cs.push_back(std::make_unique<Collector>());
    ASSERT_TRUE(engine->Submit(Greedy(p, 150), cs.back()->Callback()).ok());
  }
  for (auto& c : cs) {
    c->Wait();
    EXPECT_EQ(c->last.finish_reason, "length");
  }
  EXPECT_EQ(engine->Stats().preemptions, 0);
  EXPECT_EQ(engine->Stats().pages_used, 0);
}

TEST_F(EngineTest, RequestThatCanNeverFitIsRefused) {
  auto engine = Make(4);  // 64 slots
  Collector c;
  // A text prompt: the pool check needs its tokens, so the refusal comes as a "rejected" delta.
  ASSERT_TRUE(engine->Submit(Greedy("Once upon a time", 200), c.Callback()).ok());
  c.Wait();
  EXPECT_EQ(c.last.finish_reason, "rejected");
  EXPECT_TRUE(absl::IsInvalidArgument(c.last.status));
  EXPECT_NE(c.last.status.message().find("KV pages"), absl::string_view::npos);
  // Token ids: refused by Submit.
  GenerationRequest ids;
  ids.prompt_token_ids = {1, 403, 407};
  ids.max_new_tokens = 200;
  auto s = engine->Submit(ids, c.Callback());
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(s.status()));
  EXPECT_NE(s.status().message().find("KV pages"), absl::string_view::npos);
  EXPECT_EQ(engine->Stats().sequences_waiting, 0);
}

TEST_F(EngineTest, StopStringsAndStopTokens) {
  auto engine = Make(64);
  // The greedy text starts "Once upon a time, there was a little girl named Lily."
  GenerationRequest r;
  r.prompt_token_ids = {1};
  r.max_new_tokens = 100;
  r.temperature = 0.0f;
  r.stop = {"little girl"};
  Collector c;
  ASSERT_TRUE(engine->Submit(r, c.Callback()).ok());
  c.Wait();
  EXPECT_EQ(c.last.finish_reason, "stop");
  EXPECT_EQ(c.text, "Once upon a time, there was a ");
}

// logprobs and top_logprobs are the model's log-softmax at each step, checked against one
// separate forward pass over the prompt and the sampled tokens with every row of logits; the
// bytes are the tokenizer's. top_logprobs needs logprobs and is at most kMaxTopLogprobs.
TEST_F(EngineTest, LogprobsAreTheModelsLogSoftmax) {
  auto engine = Make(64);
  GenerationRequest r = Greedy("Once upon a time", 24);
  r.temperature = 1.0f;  // sampled: the chosen token is not always the most likely one
  r.seed = 11;
  r.logprobs = true;
  r.top_logprobs = 5;
  Collector c;
  ASSERT_TRUE(engine->Submit(r, c.Callback()).ok());
  c.Wait();
  std::vector<float> lp;
  std::vector<std::string> bytes;
  std::vector<std::vector<TokenLogprob>> top;
  for (const GenerationDelta& d : c.deltas) {
    ASSERT_EQ(d.logprobs.size(), d.token_ids.size());
    ASSERT_EQ(d.token_bytes.size(), d.token_ids.size());
    ASSERT_EQ(d.top_logprobs.size(), d.token_ids.size());
    lp.insert(lp.end(), d.logprobs.begin(), d.logprobs.end());
    bytes.insert(bytes.end(), d.token_bytes.begin(), d.token_bytes.end());
    top.insert(top.end(), d.top_logprobs.begin(), d.top_logprobs.end());
  }
  ASSERT_GT(c.tokens.size(), 4u);

  Model m = *LoadModel(testing::ModelPath());
  Tokenizer tok = *Tokenizer::Load(testing::TokenizerPath(), 512);
  std::vector<int32_t> seq = tok.Encode("Once upon a time", true, false);
  const size_t n_prompt = seq.size();
  seq.insert(seq.end(), c.tokens.begin(), c.tokens.end());
  auto cache = *KvCache::Create(KvShapeFor(m.config, 16), 64 * kLayers);
  ModelRunner runner(m, cache.get());
  SequenceKv kv;
  SequenceStep step{&kv, seq, 0, /*all_logits=*/true};
  absl::StatusOr<std::span<const float>> logits = runner.Forward({&step, 1});
  ASSERT_TRUE(logits.ok()) << logits.status();
  const size_t vocab = m.config.vocab_size;
  bool some_not_top = false;
  for (size_t j = 0; j < c.tokens.size(); ++j) {
    const float* row = logits->data() + (n_prompt + j - 1) * vocab;  // predicts seq[n_prompt + j]
    double mx = row[0], sum = 0;
    for (size_t v = 0; v < vocab; ++v) mx = std::max(mx, double(row[v]));
    for (size_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - mx);
    const auto ref = [&](int32_t t) { return double(row[t]) - mx - std::log(sum); };
    EXPECT_NEAR(lp[j], ref(c.tokens[j]), 2e-3) << "token " << j;
    EXPECT_EQ(bytes[j], tok.Decode(seq[n_prompt + j - 1], c.tokens[j]));
    ASSERT_EQ(top[j].size(), 5u);
    std::vector<int32_t> order(vocab);
    for (size_t v = 0; v < vocab; ++v) order[v] = static_cast<int32_t>(v);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    for (size_t k = 0; k < 5; ++k) {
      EXPECT_NEAR(top[j][k].logprob, ref(order[k]), 2e-3) << "token " << j << " rank " << k;
      EXPECT_EQ(top[j][k].bytes, tok.Decode(seq[n_prompt + j - 1], top[j][k].token));
      if (k > 0) {
        EXPECT_GE(top[j][k - 1].logprob, top[j][k].logprob);
      }
    }
    some_not_top |= top[j][0].token != c.tokens[j];
  }
  EXPECT_TRUE(some_not_top) << "sampling at temperature 1 always took the top token";

  GenerationRequest bad = Greedy("x", 2);
  bad.top_logprobs = 3;  // without logprobs
  EXPECT_EQ(engine->Submit(bad, c.Callback()).status().code(), absl::StatusCode::kInvalidArgument);
  bad.logprobs = true;
  bad.top_logprobs = kMaxTopLogprobs + 1;
  EXPECT_EQ(engine->Submit(bad, c.Callback()).status().code(), absl::StatusCode::kInvalidArgument);
}

// Endless streaming through the engine: a sink (or window) request with a budget under the
// context generates past it when the server allows that many new tokens; full and h2o requests
// past the context are refused, as before.
TEST_F(EngineTest, SinkAndWindowRequestsStreamPastTheContext) {
  EngineOptions o;
  o.num_pages = 64 * kLayers;
  o.threads = 1;
  o.max_new_tokens_limit = 4096;
  auto e = Engine::Create(*LoadModel(testing::ModelPath()),
                          std::make_shared<Tokenizer>(*Tokenizer::Load(testing::TokenizerPath(), 512)), o);
  ASSERT_TRUE(e.ok()) << e.status();
  auto& engine = *e;
  for (const char* policy : {"sink", "window"}) {
    GenerationRequest r;
    r.prompt_token_ids = {1, 403, 407};
    r.max_new_tokens = 1200;  // the context is 512
    r.temperature = 0.0f;
    r.ignore_eos = true;
    r.policy = policy;
    r.budget_tokens = 64;
    Collector c;
    ASSERT_TRUE(engine->Submit(r, c.Callback()).ok()) << policy;
    c.Wait();
    EXPECT_EQ(c.last.finish_reason, "length") << policy << ": " << c.last.status;
    EXPECT_EQ(c.last.usage.completion_tokens, 1200) << policy;
    EXPECT_LE(c.last.usage.peak_pages, 5 * kLayers) << policy;  // 64 + 1 slots of 16
    EXPECT_EQ(c.last.usage.kv_tokens_kept, 64) << policy;
    EXPECT_EQ(c.tokens.size(), 1200u);
  }
  EXPECT_EQ(engine->Stats().pages_used, 0);
  for (const char* policy : {"full", "h2o"}) {
    GenerationRequest r;
    r.prompt_token_ids = {1, 403, 407};
    r.max_new_tokens = 600;
    r.policy = policy;
    r.budget_tokens = 64;
    Collector c;
    auto s = engine->Submit(r, c.Callback());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << policy;
    EXPECT_NE(std::string(s.status().message()).find("context"), std::string::npos);
  }
}

// A few hundred tokens of the bundled model's kind of story: a long shared prompt prefix.
std::string LongStory() {
  std::ifstream in(testing::SourcePath("tests/data/eval_stories.txt"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str().substr(0, 900);
}

// Runs `r` on `engine` alone and returns what it streamed.
GenerationDelta RunOne(Engine& engine, const GenerationRequest& r, std::vector<int32_t>* tokens) {
  Collector c;
  EXPECT_TRUE(engine.Submit(r, c.Callback()).ok());
  c.Wait();
  *tokens = c.tokens;
  return c.last;
}

// Prefix caching may only save work: with it on, a request whose prompt starts with an earlier
// one's gets exactly the tokens it gets with it off, for every policy, with budgets below the
// prompt (so they evict during its prefill and decode), and reports the prompt tokens it
// reused: whole blocks below its first eviction, at a chunk-grid point for the policies whose
// channel the attention writes (snapshots), none for squeeze (it measures its layers on every
// token).
TEST_F(EngineTest, PrefixCacheGivesEveryPolicyTheTokensOfAColdRun) {
  const std::string story = LongStory();
  for (const char* policy :
       {"full", "window", "sink", "h2o", "tova", "scissorhands", "knorm", "snapkv",
        "h2o:demote=int8", "tova:granularity=page", "h2o:layers=pyramid", "h2o:layers=squeeze"}) {
    SCOPED_TRACE(policy);
    // max_step_tokens 64: prompt chunks (and snapshots) on a grid of 64 tokens.
    auto warm = Make(64, 64, 256, 64), cold = Make(64, 64, 256, 64, 1.0, false);
    GenerationRequest first = Greedy(story + " Timmy went to the park.", 4);
    GenerationRequest second = Greedy(story + " Lily saw a big red ball.", 40);
    const std::string p = policy;
    for (GenerationRequest* r : {&first, &second}) {
      r->policy = policy;
      r->budget_tokens = 150;
      r->ignore_eos = true;
    }
    std::vector<int32_t> ignored, want, got;
    RunOne(*warm, first, &ignored);
    const GenerationDelta hit = RunOne(*warm, second, &got);
    const GenerationDelta miss = RunOne(*cold, second, &want);
    EXPECT_GT(hit.usage.prompt_tokens, 250);
    EXPECT_EQ(got, want);
    EXPECT_EQ(hit.usage.kv_tokens_evicted, miss.usage.kv_tokens_evicted);
    EXPECT_EQ(miss.usage.cached_tokens, 0);
    if (p == "full") {
      EXPECT_GT(hit.usage.cached_tokens, 200);
    } else if (p == "h2o:layers=squeeze" || p == "h2o:layers=pyramid") {
      // Squeeze measures its layers on every token; pyramid's last layer (budget / 20) evicts
      // within the first chunk, so nothing is registered, and it could reuse nothing.
      EXPECT_EQ(hit.usage.cached_tokens, 0);
    } else {
      // The first request evicted after its chunk [128, 192), so it registered [0, 128).
      EXPECT_EQ(hit.usage.cached_tokens, 128);
    }
    EXPECT_EQ(warm->Stats().pages_used, 0);
    if (hit.usage.cached_tokens > 0) {
      EXPECT_GT(warm->Stats().cached_pages, 0);
    }
    EXPECT_EQ(cold->Stats().cached_pages, 0);
  }
}

// What the cache holds and reuses is reported, its pages go back to the pool when a request
// needs them (before anything is preempted), and a request cancelled mid-prefill leaves only
// finished blocks behind: a later request over them still gets a cold run's tokens.
TEST_F(EngineTest, PrefixCacheReportsReclaimsAndSurvivesCancellation) {
  const std::string story = LongStory();
  auto engine = Make(40, 64, 256, 64);  // 40 pages a layer: 640 tokens
  auto cold = Make(40, 64, 256, 64, 1.0, false);
  std::vector<int32_t> got, want;
  GenerationRequest r = Greedy(story, 8);
  RunOne(*engine, r, &got);
  CacheStats s = engine->Stats();
  EXPECT_EQ(s.pages_used, 0);
  EXPECT_GT(s.cached_pages, 10 * kLayers);
  EXPECT_EQ(s.prefix_lookups, 1);
  EXPECT_EQ(s.prefix_hits, 0);
  const GenerationDelta again = RunOne(*engine, r, &got);
  RunOne(*cold, r, &want);
  EXPECT_EQ(got, want);
  EXPECT_GT(again.usage.cached_tokens, 200);
  s = engine->Stats();
  EXPECT_EQ(s.prefix_hits, 1);
  EXPECT_EQ(s.prefix_hit_tokens, again.usage.cached_tokens);

  // A full-cache request of 500 tokens needs 32 of the 40 pages a layer: cached pages are
  // reclaimed for it, and nothing is preempted.
  GenerationRequest big = Greedy("Once upon a time", 496);
  big.ignore_eos = true;
  const GenerationDelta done = RunOne(*engine, big, &got);
  EXPECT_EQ(done.finish_reason, "length");
  s = engine->Stats();
  EXPECT_GT(s.prefix_reclaimed_pages, 0);
  EXPECT_EQ(s.preemptions, 0);
  EXPECT_EQ(s.pages_used, 0);

  // Cancelled while its prompt is being computed (chunks of 64 tokens a step).
  GenerationRequest other = Greedy(story + " Then a cat came.", 8);
  for (int32_t attempt = 0; attempt < 3; ++attempt) {
    Collector c;
    auto handle = engine->Submit(other, c.Callback());
    ASSERT_TRUE(handle.ok());
    (*handle)->Cancel();
    c.Wait();
  }
  const GenerationDelta after = RunOne(*engine, other, &got);
  RunOne(*cold, other, &want);
  EXPECT_EQ(got, want);
  EXPECT_EQ(after.finish_reason, "length");
  EXPECT_EQ(engine->Stats().pages_used, 0);
}

// With API keys on, the fronts name the key as the tenant: one tenant's cached prompt is never
// another's hit, so the other computes every prompt token, exactly the work (and so the time)
// of a cold run; `prefix_cache_share_tenants` lets them share.
TEST_F(EngineTest, PrefixCacheKeepsTenantsApart) {
  const std::string story = LongStory();
  for (bool share : {false, true}) {
    SCOPED_TRACE(share ? "shared" : "isolated");
    auto engine = Make(64, 64, 256, 512, 1.0, true, share);
    GenerationRequest a = Greedy(story, 4), b = Greedy(story, 4);
    a.tenant = a.client = "key:1";
    b.tenant = b.client = "key:2";
    std::vector<int32_t> ta, tb;
    RunOne(*engine, a, &ta);
    const GenerationDelta other = RunOne(*engine, b, &tb);
    EXPECT_EQ(ta, tb);
    if (share) {
      EXPECT_GT(other.usage.cached_tokens, 0);
    } else {
      EXPECT_EQ(other.usage.cached_tokens, 0);
      EXPECT_EQ(engine->Stats().prefix_hit_tokens, 0);
      // Its own tenant hits.
      EXPECT_GT(RunOne(*engine, a, &ta).usage.cached_tokens, 0);
    }
  }
}

TEST_F(EngineTest, StatsAndInfo) {
  auto engine = Make(100);
  ModelInfo info = engine->Info();
  EXPECT_EQ(info.context_length, 512);
  EXPECT_EQ(info.vocab_size, 512);
  EXPECT_EQ(info.pages_total, 100 * kLayers);
  EXPECT_EQ(info.block_size, 16);
  EXPECT_EQ(info.policies.size(), std::size(kPolicyNames));
  auto ids = engine->Tokenize("Once upon a time");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ((*ids)[0], 1);
  GenerationRequest r = Greedy("Once upon a time", 120);
  r.policy = "h2o";
  r.budget_tokens = 32;
  Collector c;
  ASSERT_TRUE(engine->Submit(r, c.Callback()).ok());
  c.Wait();
  EXPECT_EQ(c.last.usage.kv_tokens_kept, 32);
  EXPECT_EQ(c.last.usage.kv_tokens_evicted,
            c.last.usage.prompt_tokens + c.last.usage.completion_tokens - 1 - 32);
  EXPECT_LE(c.last.usage.peak_pages, 3 * kLayers);  // ceil(33 / 16) per layer
  EXPECT_EQ(engine->Stats().tokens_evicted, c.last.usage.kv_tokens_evicted);
  EXPECT_EQ(engine->Stats().pages_total, 100 * kLayers);
}

// The limits as resolved, Detokenize as the inverse of Tokenize, and max_new_tokens_to_context
// (OpenAI chat without max_tokens): lowered to what the context leaves, instead of refused.
TEST_F(EngineTest, ResolvedLimitsDetokenizeAndMaxNewTokensToContext) {
  auto engine = Make(100);
  const ModelInfo info = engine->Info();
  EXPECT_EQ(info.max_prompt_tokens, 511);
  EXPECT_GT(info.max_prompt_bytes, 511);
  EXPECT_EQ(info.max_new_tokens_limit, 512);
  auto ids = engine->Tokenize("Once upon a time");
  ASSERT_TRUE(ids.ok());
  // BOS is "\n<s>\n" in llama2.c's tokenizer.bin (not a control token there), and the space
  // after it is dropped as in run.c.
  EXPECT_EQ(*engine->Detokenize(*ids, /*skip_special_tokens=*/true), "\n<s>\nOnce upon a time");
  EXPECT_EQ(engine->Detokenize({1, 5000}, true).status().code(),
            absl::StatusCode::kInvalidArgument);

  GenerationRequest r = Greedy("Once upon a time", 512);
  Collector refused;  // prompt + 512 > the context: refused once the prompt is tokenized
  ASSERT_TRUE(engine->Submit(r, refused.Callback()).ok());
  refused.Wait();
  EXPECT_EQ(refused.last.finish_reason, "rejected");
  r.max_new_tokens_to_context = true;
  r.ignore_eos = true;
  Collector c;
  ASSERT_TRUE(engine->Submit(r, c.Callback()).ok());
  c.Wait();
  EXPECT_EQ(c.last.finish_reason, "length");
  EXPECT_EQ(c.last.usage.prompt_tokens + c.last.usage.completion_tokens, 512);
}

TEST_F(EngineTest, ShutdownCancelsWhatOutlivesTheGrace) {
  auto engine = Make(64);
  Collector c;
  ASSERT_TRUE(engine->Submit(Greedy("Once upon a time", 450), c.Callback()).ok());
  c.WaitForTokens(2);
  engine->Shutdown(absl::Milliseconds(1));
  c.Wait();
  EXPECT_EQ(c.last.finish_reason, "cancelled");
  Collector d;
  auto s = engine->Submit(Greedy("x", 2), d.Callback());
  EXPECT_TRUE(absl::IsUnavailable(s.status()));
}

// Structured outputs (issue 43): the mask is applied before sampling, greedy and sampled, in a
// batch of constrained and free requests; each gets the text it gets alone.
TEST_F(EngineTest, ChoiceConstraintsInAMixedBatchEqualTheirRunsAlone) {
  grammar::ConstraintSpec choice;
  choice.kind = grammar::ConstraintSpec::Kind::kChoice;
  choice.choices = {" Lily went to the park", " Tom", " the end", " happy"};
  const std::vector<std::string> prompts = {"Once upon a time", "One day", "The cat",
                                            "She was", "Tim and"};
  std::vector<std::string> alone;
  {
    auto engine = Make(64);
    for (const std::string& p : prompts) {
      GenerationRequest r = Greedy(p, 32);
      r.constraint = choice;
      Collector c;
      ASSERT_TRUE(engine->Submit(r, c.Callback()).ok());
      c.Wait();
      EXPECT_EQ(c.last.finish_reason, "stop") << c.last.error;
      EXPECT_NE(std::find(choice.choices.begin(), choice.choices.end(), c.text),
                choice.choices.end())
          << c.text;
      alone.push_back(c.text);
    }
  }
  auto engine = Make(64);
  std::vector<std::unique_ptr<Collector>> constrained, free;
  for (int round = 0; round < 2; ++round) {
    for (const std::string& p : prompts) {
      GenerationRequest r = Greedy(p, 32);
      free.push_back(std::make_unique<Collector>());
      ASSERT_TRUE(engine->Submit(r, free.back()->Callback()).ok());
      r.constraint = choice;
      constrained.push_back(std::make_unique<Collector>());
      ASSERT_TRUE(engine->Submit(r, constrained.back()->Callback()).ok());
    }
  }
  for (size_t i = 0; i < constrained.size(); ++i) {
    constrained[i]->Wait();
    free[i]->Wait();
    EXPECT_EQ(constrained[i]->text, alone[i % prompts.size()]);
    EXPECT_EQ(free[i]->text, Alone(prompts[i % prompts.size()], 32, "full", 0)) << i;
  }
}

TEST_F(EngineTest, SampledConstrainedOutputsStayInTheGrammarAndLengthEndsInside) {
  auto engine = Make(64);
  grammar::ConstraintSpec choice;
  choice.kind = grammar::ConstraintSpec::Kind::kChoice;
  choice.choices = {" yes", " no", " a long answer that needs many tokens"};
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    GenerationRequest r = Greedy("Once upon a time", 32);
    r.temperature = 1.5f;
    r.top_p = 1.0f;
    r.seed = seed;
    r.constraint = choice;
    Collector c;
    ASSERT_TRUE(engine->Submit(r, c.Callback()).ok());
    c.Wait();
    EXPECT_EQ(c.last.finish_reason, "stop") << c.last.error;
    EXPECT_NE(std::find(choice.choices.begin(), choice.choices.end(), c.text),
              choice.choices.end())
        << c.text;
  }
  choice.choices = {" a long answer that needs many tokens"};
  GenerationRequest r = Greedy("Once upon a time", 3);
  r.constraint = choice;
  Collector c;
  ASSERT_TRUE(engine->Submit(r, c.Callback()).ok());
  c.Wait();
  EXPECT_EQ(c.last.finish_reason, "length");
  EXPECT_EQ(c.last.usage.completion_tokens, 3);
  EXPECT_TRUE(std::string(" a long answer that needs many tokens").starts_with(c.text)) << c.text;
  EXPECT_EQ(engine->Stats().pages_used, 0);
}

TEST_F(EngineTest, ConstraintsThatDoNotCompileAreRefusedInSubmit) {
  auto engine = Make(64);
  GenerationRequest r = Greedy("Once upon a time", 8);
  r.constraint.kind = grammar::ConstraintSpec::Kind::kChoice;  // no choices
  Collector c;
  absl::StatusOr<std::shared_ptr<RequestHandle>> h = engine->Submit(r, c.Callback());
  EXPECT_TRUE(absl::IsInvalidArgument(h.status())) << h.status();
  EXPECT_NE(h.status().message().find("choice"), std::string::npos) << h.status();
}

// A constraint whose automaton passes its limits mid-way (here more open parses than a state may
// hold, after the first byte) ends its request with an error naming the limit; its pages are
// freed and a request beside it is unharmed.
TEST_F(EngineTest, AConstraintPastItsLimitsEndsWithAnErrorAndFreesItsPages) {
  auto engine = Make(64);
  std::string gbnf = "root ::= \"b\"";
  for (int i = 0; i < 3000; ++i) gbnf += " x";
  gbnf += "\nx ::= \"a\"*\n";
  GenerationRequest r = Greedy("Once upon a time", 16);
  r.constraint.kind = grammar::ConstraintSpec::Kind::kGbnf;
  r.constraint.text = gbnf;
  Collector c, free;
  ASSERT_TRUE(engine->Submit(r, c.Callback()).ok());
  ASSERT_TRUE(engine->Submit(Greedy("Once upon a time", 16), free.Callback()).ok());
  c.Wait();
  free.Wait();
  EXPECT_EQ(c.last.finish_reason, "error");
  EXPECT_NE(c.last.error.find("ambiguous"), std::string::npos) << c.last.error;
  EXPECT_EQ(free.text, Alone("Once upon a time", 16, "full", 0));
  EXPECT_EQ(engine->Stats().pages_used, 0);
}

// A constraint holds under every KV policy and with a prompt prefix taken from the cache.
TEST_F(EngineTest, ConstraintsHoldUnderEveryPolicyAndWithACachedPrefix) {
  auto engine = Make(64);
  grammar::ConstraintSpec regex;
  regex.kind = grammar::ConstraintSpec::Kind::kRegex;
  regex.text = " (Lily|Tom|Sue) (ran|sat|saw) [a-z ]{3,30}\\.";
  const std::string prompt(200, 'a');  // long enough to evict and to cache its blocks
  for (const char* policy : {"full", "window", "sink", "h2o", "tova", "scissorhands", "knorm",
                             "snapkv"}) {
    for (int round = 0; round < 2; ++round) {  // the second finds the prompt's blocks cached
      GenerationRequest r = Greedy(prompt, 40);
      r.policy = policy;
      if (std::string(policy) != "full") r.budget_tokens = 64;
      r.constraint = regex;
      Collector c;
      ASSERT_TRUE(engine->Submit(r, c.Callback()).ok()) << policy;
      c.Wait();
      SCOPED_TRACE(policy);
      EXPECT_TRUE(c.last.finish_reason == "stop" || c.last.finish_reason == "length")
          << c.last.finish_reason << " " << c.last.error;
      if (c.last.finish_reason == "stop") {
        ASSERT_TRUE(grammar::Matches(*grammar::CompileGrammar(regex), c.text)) << c.text;
      }
    }
  }
  EXPECT_GT(engine->Stats().prefix_hits, 0);
}

// ---- The sampling API (issue 44) through the engine ----

// The engine's tokens for `r`, run alone.
std::vector<int32_t> EngineTokens(Engine& engine, const GenerationRequest& r,
                                  GenerationDelta* last = nullptr) {
  Collector c;
  EXPECT_TRUE(engine.Submit(r, c.Callback()).ok());
  c.Wait();
  if (last != nullptr) *last = c.last;
  return c.tokens;
}

size_t Distinct(const std::vector<int32_t>& tokens) {
  return std::set<int32_t>(tokens.begin(), tokens.end()).size();
}

TEST_F(EngineTest, LogitBiasForcesAGreedyToken) {
  auto engine = Make(64);
  GenerationRequest r = Greedy("Once upon a time", 8);
  r.logit_bias = {{300, 100.0f}};
  EXPECT_EQ(EngineTokens(*engine, r), std::vector<int32_t>(8, 300));
  // -100 on the greedy first token: another one comes first.
  const std::vector<int32_t> plain = EngineTokens(*engine, Greedy("Once upon a time", 8));
  ASSERT_FALSE(plain.empty());
  r.logit_bias = {{plain[0], -100.0f}};
  const std::vector<int32_t> banned = EngineTokens(*engine, r);
  ASSERT_FALSE(banned.empty());
  for (int32_t t : banned) EXPECT_NE(t, plain[0]);
}

// Penalties change a greedy output that repeats, towards more distinct tokens, and the engine
// gives the same tokens as the one-sequence Generate with the same sampling (both Accept).
TEST_F(EngineTest, PenaltiesChangeARepeatingGreedyOutputAsGenerateDoes) {
  auto engine = Make(64);
  const std::string prompt = "Once upon a time";
  GenerationRequest plain_request = Greedy(prompt, 60);
  plain_request.ignore_eos = true;
  const std::vector<int32_t> plain = EngineTokens(*engine, plain_request);
  ASSERT_EQ(plain.size(), 60u);
  ASSERT_LT(Distinct(plain), plain.size());  // it repeats

  Model m = *LoadModel(testing::ModelPath());
  Tokenizer tok = *Tokenizer::Load(testing::TokenizerPath(), 512);
  auto cache = *KvCache::Create(KvShapeFor(m.config, 16), 64 * kLayers);
  ModelRunner runner(m, cache.get());
  const std::vector<int32_t> ids = tok.Encode(prompt, true, false);
  for (int which = 0; which < 3; ++which) {
    SCOPED_TRACE(which);
    GenerationRequest r = plain_request;
    GenerateOptions opt;
    opt.sampling.temperature = 0;
    opt.ignore_eos = true;
    opt.steps = static_cast<int32_t>(ids.size()) + 60 - 1;
    if (which == 0) {
      r.repetition_penalty = opt.sampling.repetition_penalty = 1.8f;
    } else if (which == 1) {
      r.presence_penalty = opt.sampling.presence_penalty = 1.5f;
    } else {
      r.frequency_penalty = opt.sampling.frequency_penalty = 1.0f;
      r.repetition_penalty = opt.sampling.repetition_penalty = 1.3f;
      r.penalty_last_n = opt.sampling.penalty_last_n = 8;
    }
    const std::vector<int32_t> penalised = EngineTokens(*engine, r);
    EXPECT_NE(penalised, plain);
    EXPECT_GT(Distinct(penalised), Distinct(plain));
    auto alone = Generate(runner, ids, opt, [](int32_t, int32_t) {});
    ASSERT_TRUE(alone.ok()) << alone.status();
    EXPECT_EQ(std::vector<int32_t>(alone->tokens.begin() + int32_t(ids.size()),
                                   alone->tokens.end()),
              penalised);
  }
}

// min_tokens bans the stop tokens (and EOS) until that many tokens were generated.
TEST_F(EngineTest, MinTokensHoldsBackStopTokens) {
  auto engine = Make(64);
  GenerationRequest r = Greedy("Once upon a time", 40);
  r.ignore_eos = true;
  const std::vector<int32_t> plain = EngineTokens(*engine, r);
  ASSERT_GE(plain.size(), 6u);
  r.stop_token_ids = {plain[2]};  // ends the request at its third token at the latest
  GenerationDelta last;
  EXPECT_LE(EngineTokens(*engine, r, &last).size(), 2u);
  EXPECT_EQ(last.finish_reason, "stop");
  r.min_tokens = 10;
  const std::vector<int32_t> held = EngineTokens(*engine, r, &last);
  ASSERT_GE(held.size(), 10u);
  for (size_t i = 0; i < 10; ++i) EXPECT_NE(held[i], plain[2]) << i;
}

TEST_F(EngineTest, OutOfRangeSamplingFieldsAreRefusedByName) {
  auto engine = Make(16);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::function<void(GenerationRequest&)> set;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](GenerationRequest& r) { r.min_p = 1.5f; }, "sampling.min_p"},
      {[&](GenerationRequest& r) { r.min_p = nan; }, "sampling.min_p"},
      {[](GenerationRequest& r) { r.presence_penalty = -2.5f; }, "sampling.presence_penalty"},
      {[&](GenerationRequest& r) { r.presence_penalty = inf; }, "sampling.presence_penalty"},
      {[](GenerationRequest& r) { r.frequency_penalty = 3.0f; }, "sampling.frequency_penalty"},
      {[](GenerationRequest& r) { r.repetition_penalty = 0.0f; }, "sampling.repetition_penalty"},
      {[](GenerationRequest& r) { r.repetition_penalty = 11.0f; }, "sampling.repetition_penalty"},
      {[&](GenerationRequest& r) { r.repetition_penalty = nan; }, "sampling.repetition_penalty"},
      {[](GenerationRequest& r) { r.penalty_last_n = -2; }, "sampling.penalty_last_n"},
      {[](GenerationRequest& r) { r.logit_bias = {{512, 1.0f}}; }, "sampling.logit_bias"},
      {[](GenerationRequest& r) { r.logit_bias = {{-1, 1.0f}}; }, "sampling.logit_bias"},
      {[](GenerationRequest& r) { r.logit_bias = {{3, 100.5f}}; }, "sampling.logit_bias"},
      {[&](GenerationRequest& r) { r.logit_bias = {{3, nan}}; }, "sampling.logit_bias"},
      {[](GenerationRequest& r) {
         r.logit_bias.assign(kMaxLogitBias + 1, {3, 1.0f});
       },
       "sampling.logit_bias"},
      {[](GenerationRequest& r) { r.min_tokens = -1; }, "sampling.min_tokens"},
      {[](GenerationRequest& r) { r.min_tokens = 9; }, "sampling.min_tokens"},  // > max_new
  };
  for (const Case& c : cases) {
    GenerationRequest r = Greedy("Once upon a time", 8);
    c.set(r);
    Collector collector;
    const auto refused = engine->Submit(r, collector.Callback());
    ASSERT_FALSE(refused.ok()) << c.field;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_EQ(RequestFieldOf(refused.status()), c.field) << refused.status();
  }
  // The edges are accepted.
  GenerationRequest edges = Greedy("Once upon a time", 8);
  edges.min_p = 1.0f;
  edges.presence_penalty = -2.0f;
  edges.frequency_penalty = 2.0f;
  edges.repetition_penalty = 10.0f;
  edges.penalty_last_n = -1;
  edges.logit_bias = {{0, -100.0f}, {511, 100.0f}};
  edges.min_tokens = 8;
  EXPECT_EQ(EngineTokens(*engine, edges).size(), 8u);
}

}  // namespace
}  // namespace heavykv
