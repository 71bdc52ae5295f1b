// n choices of one request (GenerationRequest::n; docs/ARCHITECTURE.md "The sampling API"): the
// prompt runs once and forks; every choice streams under its own index with its own finish, the
// request ends once; a seeded request gives the same n texts every time, and the same texts
// whether its choices share the prompt's pages, copy them, or compute the prompt themselves.
#include <gtest/gtest.h>

#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "engine/grammar/constraint_spec.h"
#include "engine/serving/engine.h"
#include "engine/serving/request_field.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/test_util.h"

namespace heavykv {
namespace {

constexpr int32_t kLayers = 5;  // the bundled model's: a CPU page holds one layer

struct Choice {
  std::vector<int32_t> tokens;
  std::string text;
  std::string finish_reason;
  int32_t finished_deltas = 0;
};

// One request's deltas by choice; Wait() blocks until the request's last delta.
struct Choices {
  std::mutex mu;
  std::condition_variable cv;
  std::map<int32_t, Choice> by_index;
  std::vector<int32_t> order;  // the index of every delta, as they came
  bool finished = false;
  GenerationDelta last;
  std::function<void()> on_first;  // called (once) with the first delta, outside the lock

  std::function<void(const GenerationDelta&)> Callback() {
    return [this](const GenerationDelta& d) {
      std::function<void()> first;
      {
        std::lock_guard<std::mutex> lock(mu);
        EXPECT_FALSE(finished) << "a delta after the request's last one";
        Choice& c = by_index[d.index];
        EXPECT_EQ(c.finished_deltas, 0) << "a delta after choice " << d.index << " finished";
        c.tokens.insert(c.tokens.end(), d.token_ids.begin(), d.token_ids.end());
        c.text += d.text;
        order.push_back(d.index);
        if (d.choice_finished) {
          c.finish_reason = d.finish_reason;
          ++c.finished_deltas;
        }
        if (d.finished) {
          EXPECT_TRUE(d.choice_finished);
          finished = true;
          last = d;
        }
        if (order.size() == 1) first = on_first;
      }
      if (first) first();
      cv.notify_all();
    };
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return finished; }));
  }
  std::vector<std::string> Texts() {
    std::vector<std::string> out;
    for (auto& [i, c] : by_index) out.push_back(c.text);
    return out;
  }
};

std::string Story(size_t bytes) {
  std::ifstream in(testing::SourcePath("tests/data/eval_stories.txt"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str().substr(0, bytes);
}

std::unique_ptr<Engine> Make(int32_t pages, bool prefix_cache = true, int32_t max_running = 64,
                             int32_t max_n = 16) {
  EngineOptions o;
  o.num_pages = pages * kLayers;
  o.prefix_cache = prefix_cache;
  o.max_running = max_running;
  o.max_n = max_n;
  o.threads = 1;
  auto e = Engine::Create(*LoadModel(testing::ModelPath()),
                          std::make_shared<Tokenizer>(*Tokenizer::Load(testing::TokenizerPath(), 512)),
                          o);
  EXPECT_TRUE(e.ok()) << e.status();
  return *std::move(e);
}

GenerationRequest Sampled(std::string prompt, int32_t n, int32_t max_new, uint64_t seed = 7) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.n = n;
  r.max_new_tokens = max_new;
  r.temperature = 1.0f;
  r.top_p = 0.95f;
  r.seed = seed;
  r.ignore_eos = true;
  return r;
}

void RunRequest(Engine& e, const GenerationRequest& r, Choices& c) {
  ASSERT_TRUE(e.Submit(r, c.Callback()).ok());
  c.Wait();
}

TEST(ChoicesTest, EveryChoiceStreamsUnderItsIndexAndTheRequestEndsOnce) {
  auto engine = Make(64);
  Choices c;
  RunRequest(*engine, Sampled("Once upon a time", 4, 24), c);
  ASSERT_EQ(c.by_index.size(), 4u);
  int32_t completion = 0;
  for (auto& [i, choice] : c.by_index) {
    EXPECT_EQ(choice.finished_deltas, 1) << i;
    EXPECT_EQ(choice.finish_reason, "length") << i;
    EXPECT_EQ(choice.tokens.size(), 24u) << i;
    completion += int32_t(choice.tokens.size());
  }
  EXPECT_EQ(c.last.usage.completion_tokens, completion);
  EXPECT_EQ(c.last.usage.prompt_tokens, 5);  // BOS and the prompt's 4 tokens, counted once
  // Streaming interleaves the choices: the first deltas are one per choice, in index order.
  ASSERT_GE(c.order.size(), 8u);
  for (int32_t i = 0; i < 8; ++i) EXPECT_EQ(c.order[size_t(i)], i % 4);
  EXPECT_EQ(engine->Stats().pages_used, 0);
}

TEST(ChoicesTest, ASeededRequestGivesTheSameChoicesAndChoiceZeroIsTheRequestAlone) {
  auto engine = Make(64);
  Choices a, b, alone;
  RunRequest(*engine, Sampled("One day", 4, 30, 1234), a);
  RunRequest(*engine, Sampled("One day", 4, 30, 1234), b);
  RunRequest(*engine, Sampled("One day", 1, 30, 1234), alone);
  EXPECT_EQ(a.Texts(), b.Texts());
  EXPECT_EQ(a.by_index[0].tokens, alone.by_index[0].tokens);
  // Each choice samples from its own stream: 30 tokens at temperature 1 differ somewhere.
  std::set<std::vector<int32_t>> distinct;
  for (auto& [i, choice] : a.by_index) distinct.insert(choice.tokens);
  EXPECT_EQ(distinct.size(), 4u);
}

// Choice i is the request alone with seed ChoiceSeed(seed, i): whether it shared the prompt's
// pages (full) or copied them (a policy that evicts), its cache held what its own prefill would
// have left. Without room to fork (max_running 1), the full cache's choices compute the prompt
// again and still give the same texts.
TEST(ChoicesTest, EachChoiceIsTheRequestAloneWithItsSeed) {
  const std::string prompt = Story(700);
  for (const char* policy : {"full", "h2o", "window", "h2o:demote=int8", "snapkv"}) {
    SCOPED_TRACE(policy);
    GenerationRequest r = Sampled(prompt, 3, 40, 99);
    r.policy = policy;
    if (std::string(policy) != "full") r.budget_tokens = 96;
    Choices forked;
    auto engine = Make(128);
    RunRequest(*engine, r, forked);
    ASSERT_EQ(forked.by_index.size(), 3u);
    for (int32_t i = 0; i < 3; ++i) {
      GenerationRequest one = r;
      one.n = 1;
      one.seed = ChoiceSeed(99, i);
      Choices alone;
      RunRequest(*engine, one, alone);
      EXPECT_EQ(forked.by_index[i].tokens, alone.by_index[0].tokens) << "choice " << i;
    }
    if (std::string(policy) == "full") {
      Choices recomputed, no_cache;
      RunRequest(*Make(128, /*prefix_cache=*/true, /*max_running=*/1), r, recomputed);
      RunRequest(*Make(128, /*prefix_cache=*/false), r, no_cache);
      EXPECT_EQ(forked.Texts(), recomputed.Texts());
      EXPECT_EQ(forked.Texts(), no_cache.Texts());
    }
    EXPECT_EQ(engine->Stats().pages_used, 0);
  }
}

// Each choice's sampler counts what the request's would: the prompt for repetition_penalty,
// its own tokens for presence and frequency.
TEST(ChoicesTest, EachChoiceSamplesWithTheRequestsPenalties) {
  auto engine = Make(128);
  GenerationRequest r = Sampled(Story(400), 3, 40, 31);
  r.repetition_penalty = 1.8f;
  r.presence_penalty = 0.7f;
  r.frequency_penalty = 0.3f;
  Choices forked;
  RunRequest(*engine, r, forked);
  ASSERT_EQ(forked.by_index.size(), 3u);
  for (int32_t i = 0; i < 3; ++i) {
    GenerationRequest one = r;
    one.n = 1;
    one.seed = ChoiceSeed(31, i);
    Choices alone;
    RunRequest(*engine, one, alone);
    EXPECT_EQ(forked.by_index[i].tokens, alone.by_index[0].tokens) << "choice " << i;
  }
}

TEST(ChoicesTest, FullCacheChoicesHoldThePromptOnce) {
  const std::string prompt = Story(1200);  // about 300 tokens: 19 pages a layer
  auto engine = Make(160);
  GenerationRequest r = Sampled(prompt, 8, 32);
  int32_t pages_seen = 0;
  Choices c;
  c.on_first = [&] { pages_seen = engine->Stats().pages_used; };
  RunRequest(*engine, r, c);
  const int32_t prompt_tokens = c.last.usage.prompt_tokens;
  const int32_t prompt_pages = (prompt_tokens + 15) / 16 * kLayers;
  // Eight copies would be 8 x prompt_pages; shared, the prompt once, each choice its last page
  // and the pages of its 32 tokens (at most 3 a layer).
  EXPECT_LE(c.last.usage.peak_pages, prompt_pages + 8 * 3 * kLayers);
  EXPECT_GE(c.last.usage.peak_pages, prompt_pages);
  EXPECT_LE(pages_seen, prompt_pages + 8 * kLayers);
  EXPECT_EQ(engine->Stats().pages_used, 0);
}

TEST(ChoicesTest, CancellingEndsEveryChoiceAndOneChoiceEndingFreesOnlyItsPages) {
  auto engine = Make(64);
  {
    GenerationRequest r = Sampled("Once upon a time", 4, 200);
    Choices c;
    std::shared_ptr<RequestHandle> handle;
    c.on_first = [&] { /* cancelled below, once streaming */ };
    auto h = engine->Submit(r, c.Callback());
    ASSERT_TRUE(h.ok());
    {
      std::unique_lock<std::mutex> lock(c.mu);
      ASSERT_TRUE(c.cv.wait_for(lock, std::chrono::seconds(60), [&] { return c.order.size() >= 8; }));
    }
    (*h)->Cancel();
    c.Wait();
    ASSERT_EQ(c.by_index.size(), 4u);
    for (auto& [i, choice] : c.by_index) {
      EXPECT_EQ(choice.finish_reason, "cancelled") << i;
      EXPECT_EQ(choice.finished_deltas, 1) << i;
    }
    EXPECT_EQ(engine->Stats().pages_used, 0);
  }
  // A stop string ends choices at different lengths; the others go on to theirs.
  GenerationRequest r = Sampled("Once upon a time", 6, 60, 5);
  r.stop = {"."};
  Choices c;
  RunRequest(*engine, r, c);
  ASSERT_EQ(c.by_index.size(), 6u);
  std::set<size_t> lengths;
  for (auto& [i, choice] : c.by_index) {
    EXPECT_EQ(choice.finished_deltas, 1);
    EXPECT_TRUE(choice.finish_reason == "stop" || choice.finish_reason == "length")
        << choice.finish_reason;
    EXPECT_EQ(choice.text.find('.'), std::string::npos);
    lengths.insert(choice.tokens.size());
  }
  EXPECT_GT(lengths.size(), 1u);
  EXPECT_EQ(engine->Stats().pages_used, 0);
}

TEST(ChoicesTest, ConstrainedChoicesEachMatchTheGrammar) {
  auto engine = Make(64);
  GenerationRequest r = Sampled("The cat", 5, 32);
  r.ignore_eos = false;
  r.constraint.kind = grammar::ConstraintSpec::Kind::kChoice;
  r.constraint.choices = {" sat", " ran away", " was happy", " Tom"};
  Choices c;
  RunRequest(*engine, r, c);
  ASSERT_EQ(c.by_index.size(), 5u);
  for (auto& [i, choice] : c.by_index) {
    EXPECT_EQ(choice.finish_reason, "stop") << i;
    EXPECT_NE(std::find(r.constraint.choices.begin(), r.constraint.choices.end(), choice.text),
              r.constraint.choices.end())
        << choice.text;
  }
}

TEST(ChoicesTest, NIsBounded) {
  auto engine = Make(64, true, 64, /*max_n=*/4);
  Choices c;
  for (int32_t n : {0, 5, -1}) {
    auto s = engine->Submit(Sampled("Once", n, 4), c.Callback());
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(RequestFieldOf(s.status()), "n");
  }
  RunRequest(*engine, Sampled("Once", 4, 4), c);
  EXPECT_EQ(c.by_index.size(), 4u);
}

}  // namespace
}  // namespace heavykv
