// End-to-end tests of `heavykv serve`: the real binary as a child process on a loopback port,
// spoken to with real gRPC (heavykv.v1.Generation and grpc.health.v1.Health) and plain HTTP
// (/metrics). Two servers are shared by the tests: the bundled stories260K model (fast, for
// output equality and bad requests), and a random model with a 2048-token context on one thread
// (about 1 ms a token, so a 2000-token request is still running when a test cancels it).
#include "tests/server/server_harness.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace heavykv {
namespace {

using namespace std::chrono_literals;
using namespace heavykv::e2e;
using grpc::health::v1::HealthCheckResponse;

// A random model with a 2048-token context, big enough that one thread takes about 1 ms a token
// even on a fast core (dim 256 ran 2,000 tokens in 0.3-0.9 s on a Zen 5, too fast for the tests
// below that need a request still running after a second: deadline, drain, connection age).
std::string SlowModel(const testing::TempDir& dir) {
  const std::string model = dir.File("slow.bin");
  RunCapture(Bin() +
             " make-model --dim 512 --hidden-dim 1536 --layers 4 --heads 8 --kv-heads 4 "
             "--vocab 512 --seq-len 2048 --out " +
             model + " 2>&1");
  return model;
}

class ServerE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fast_ =
        new ServerProcess({"--model", testing::ModelPath(), "--tokenizer", testing::TokenizerPath(),
                           "--max-prompt-tokens", "64", "--threads", "1"});
    slow_dir_ = new testing::TempDir();
    const std::string model = SlowModel(*slow_dir_);
    slow_ =
        new ServerProcess({"--model", model, "--tokenizer", testing::TokenizerPath(), "--threads",
                           "1", "--max-running", "1", "--max-waiting", "1", "--kv-pages", "512"});
  }
  static void TearDownTestSuite() {
    delete fast_;
    delete slow_;
    delete slow_dir_;
  }
  void SetUp() override {
    ASSERT_TRUE(fast_->ok()) << fast_->log();
    ASSERT_TRUE(slow_->ok()) << slow_->log();
  }

  int32_t PromptTokens(const std::string& text) {
    grpc::ClientContext context;
    v1::TokenizeRequest req;
    req.set_text(text);
    v1::TokenizeResponse resp;
    EXPECT_TRUE(fast_->stub().Tokenize(&context, req, &resp).ok());
    return resp.token_ids_size();
  }

  static ServerProcess* fast_;
  static ServerProcess* slow_;
  static testing::TempDir* slow_dir_;
};
ServerProcess* ServerE2eTest::fast_ = nullptr;
ServerProcess* ServerE2eTest::slow_ = nullptr;
testing::TempDir* ServerE2eTest::slow_dir_ = nullptr;

TEST_F(ServerE2eTest, HealthServingAndModelInfo) {
  EXPECT_EQ(fast_->Health(), HealthCheckResponse::SERVING);
  grpc::ClientContext context;
  v1::ModelInfo info;
  ASSERT_TRUE(fast_->stub().GetModelInfo(&context, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.architecture(), "llama");
  EXPECT_EQ(info.context_length(), 512);
  EXPECT_EQ(info.vocab_size(), 512);
  EXPECT_EQ(info.block_size(), 16);
  EXPECT_EQ(info.default_policy(), "full");
  EXPECT_GT(info.pages_total(), 0);
  EXPECT_EQ(info.pool_bytes(), info.page_bytes() * info.pages_total());
  EXPECT_EQ(std::vector<std::string>(info.policies().begin(), info.policies().end()),
            (std::vector<std::string>{"full", "window", "sink", "h2o", "tova", "scissorhands",
                                      "knorm", "snapkv"}));
}

TEST_F(ServerE2eTest, GreedyStreamEqualsRun) {
  const std::string prompt = "Once upon a time";
  const int32_t n = PromptTokens(prompt);
  ASSERT_EQ(n, 5);  // BOS + 4
  Streamed s = Generate(fast_->stub(), Greedy(prompt, 40));
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  const std::string run = RunJson(prompt, n, 40);
  std::vector<int32_t> run_ids = JsonInts(run, "token_ids");
  ASSERT_EQ(run_ids.size(), size_t(n + 40)) << run;
  EXPECT_EQ(s.ids, std::vector<int32_t>(run_ids.begin() + n, run_ids.end()));
  EXPECT_EQ(prompt + s.text, JsonString(run, "text"));
  EXPECT_GT(s.messages, 1);  // streamed, not one reply
  EXPECT_EQ(s.last.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(s.last.usage().prompt_tokens(), n);
  EXPECT_EQ(s.last.usage().completion_tokens(), 40);
  EXPECT_GE(s.last.usage().peak_pages(), 3);  // 44 tokens, 16 a page
  EXPECT_GT(s.last.timings().total_seconds(), 0);

  // `heavykv generate` prints the same text as it streams.
  EXPECT_EQ(RunCapture(Bin() + " generate --server " + fast_->address() +
                       " --temperature 0 --max-tokens 40 '" + prompt + "' 2>/dev/null"),
            s.text + "\n");
}

TEST_F(ServerE2eTest, SixtyFourConcurrentStreamsEqualTheirSequentialRuns) {
  const char* kAdjectives[] = {"big", "small", "happy", "sad", "red", "old", "kind", "shy"};
  const char* kNouns[] = {"dog", "cat", "bird", "girl", "boy", "tree", "fish", "frog"};
  std::vector<std::string> prompts;
  for (const char* a : kAdjectives) {
    for (const char* n : kNouns) prompts.push_back(std::string("The ") + a + " " + n);
  }
  std::vector<std::vector<int32_t>> expected;
  std::vector<int32_t> max_new;
  for (size_t i = 0; i < prompts.size(); ++i) {
    max_new.push_back(24 + int32_t(i % 5) * 8);
    const int32_t n = PromptTokens(prompts[i]);
    std::vector<int32_t> ids = JsonInts(RunJson(prompts[i], n, max_new[i]), "token_ids");
    ASSERT_GT(ids.size(), size_t(n));
    expected.emplace_back(ids.begin() + n, ids.end());
  }
  std::vector<Streamed> got(prompts.size());
  std::atomic<bool> done = false;
  int32_t max_running = 0;
  std::thread poll([&] {
    while (!done) {
      max_running = std::max(max_running, fast_->Stats().sequences_running());
      std::this_thread::sleep_for(2ms);
    }
  });
  std::vector<std::thread> clients;
  for (size_t i = 0; i < prompts.size(); ++i) {
    clients.emplace_back(
        [&, i] { got[i] = Generate(fast_->stub(), Greedy(prompts[i], max_new[i])); });
  }
  for (std::thread& t : clients) t.join();
  done = true;
  poll.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(got[i].status.ok()) << prompts[i] << ": " << got[i].status.error_message();
    EXPECT_EQ(got[i].ids, expected[i]) << prompts[i];
  }
  EXPECT_GT(max_running, 1) << "the streams were never batched together";
  EXPECT_EQ(fast_->WaitIdle().pages_used(), 0);
}

TEST_F(ServerE2eTest, CancelMidStreamReturnsThePages) {
  const double cancelled_before =
      slow_->Metrics()["heavykv_request_success_total{finish_reason=\"cancelled\"}"];
  grpc::ClientContext context;
  auto reader = slow_->stub().Generate(&context, Long());
  v1::GenerateResponse m;
  ASSERT_TRUE(reader->Read(&m));
  std::this_thread::sleep_for(50ms);
  EXPECT_GT(slow_->Stats().pages_used(), 0);
  context.TryCancel();
  while (reader->Read(&m)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  const v1::CacheStats s = slow_->WaitIdle();
  EXPECT_EQ(s.pages_used(), 0);
  EXPECT_EQ(s.sequences_running(), 0);
  EXPECT_EQ(slow_->Metrics()["heavykv_request_success_total{finish_reason=\"cancelled\"}"],
            cancelled_before + 1);
}

TEST_F(ServerE2eTest, DeadlineReturnsThePages) {
  const double cancelled_before =
      slow_->Metrics()["heavykv_request_success_total{finish_reason=\"cancelled\"}"];
  Streamed s = Generate(slow_->stub(), Long(), 300ms);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_GT(s.ids.size(), 0u);
  EXPECT_LT(s.ids.size(), 2000u);
  const v1::CacheStats st = slow_->WaitIdle();
  EXPECT_EQ(st.pages_used(), 0);
  EXPECT_EQ(st.sequences_running(), 0);
  EXPECT_EQ(slow_->Metrics()["heavykv_request_success_total{finish_reason=\"cancelled\"}"],
            cancelled_before + 1);
}

TEST_F(ServerE2eTest, BadRequestsAreInvalidArgumentAndTheServerKeepsServing) {
  std::vector<std::pair<std::string, v1::GenerateRequest>> bad;
  auto add = [&](const std::string& what, auto change) {
    v1::GenerateRequest r = Greedy("Once upon a time", 8);
    change(r);
    bad.emplace_back(what, r);
  };
  add("no input", [](auto& r) { r.clear_input(); });
  add("empty prompt", [](auto& r) { r.set_prompt(""); });
  add("empty token ids", [](auto& r) { r.mutable_prompt_token_ids(); });
  add("max_new_tokens 0", [](auto& r) { r.set_max_new_tokens(0); });
  add("max_new_tokens past context", [](auto& r) { r.set_max_new_tokens(100000); });
  add("negative temperature", [](auto& r) { r.mutable_sampling()->set_temperature(-1); });
  add("top_p 2", [](auto& r) { r.mutable_sampling()->set_top_p(2); });
  add("top_k past vocab", [](auto& r) { r.mutable_sampling()->set_top_k(100000); });
  add("unknown policy", [](auto& r) { r.mutable_kv()->set_policy("lru"); });
  add("budget fraction 1.5", [](auto& r) { r.mutable_kv()->set_budget_fraction(1.5); });
  add("budget tokens 0", [](auto& r) { r.mutable_kv()->set_budget_tokens(0); });
  add("recent fraction 0", [](auto& r) { r.mutable_kv()->set_recent_fraction(0); });
  add("token id past vocab", [](auto& r) { r.mutable_prompt_token_ids()->add_ids(9999); });
  add("negative token id", [](auto& r) { r.mutable_prompt_token_ids()->add_ids(-1); });
  add("stop token past vocab", [](auto& r) { r.add_stop_token_ids(512); });
  add("invalid UTF-8 prompt", [](auto& r) { r.set_prompt("Once \xff\xfe time"); });
  add("invalid UTF-8 stop", [](auto& r) { r.add_stop("\xc3"); });
  add("empty choice list", [](auto& r) { r.mutable_constraint()->mutable_choice(); });
  add("prompt over --max-prompt-tokens 64", [](auto& r) {
    for (int i = 0; i < 80; ++i) r.mutable_prompt_token_ids()->add_ids(300);
  });
  const std::string rejected = "heavykv_request_rejected_total{code=\"INVALID_ARGUMENT\"}";
  const double rejected_before = fast_->Metrics()[rejected];
  for (const auto& [what, req] : bad) {
    Streamed s = Generate(fast_->stub(), req);
    EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << what;
    EXPECT_FALSE(s.status.error_message().empty()) << what;
    EXPECT_EQ(s.messages, 0) << what;
  }
  EXPECT_EQ(fast_->Metrics()[rejected] - rejected_before, double(bad.size()));
  grpc::ClientContext context;
  v1::TokenizeRequest tok;
  tok.set_text("\xff");
  v1::TokenizeResponse tok_resp;
  EXPECT_EQ(fast_->stub().Tokenize(&context, tok, &tok_resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  Streamed good = Generate(fast_->stub(), Greedy("Once upon a time", 8));
  EXPECT_TRUE(good.status.ok()) << good.status.error_message();
  EXPECT_EQ(good.ids.size(), 8u);
  EXPECT_EQ(fast_->Health(), HealthCheckResponse::SERVING);
}

// Structured outputs over gRPC (issue 43): the `constraint` field holds the output to its
// grammar, and the stream ends with STOP when it is matched whole.
TEST_F(ServerE2eTest, ChoiceConstraintHoldsTheOutput) {
  v1::GenerateRequest r = Greedy("Once upon a time", 40);
  for (const char* c : {" yes", " no", " the little dog ran"}) {
    r.mutable_constraint()->mutable_choice()->add_choices(c);
  }
  Streamed s = Generate(fast_->stub(), r);
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_TRUE(s.text == " yes" || s.text == " no" || s.text == " the little dog ran") << s.text;
  EXPECT_EQ(s.last.finish_reason(), v1::FINISH_REASON_STOP);
}

// The last message says which policy and budget the request ran with, the server's default
// (full, no budget) when it named none.
TEST_F(ServerE2eTest, UsageReportsTheResolvedPolicyAndBudget) {
  Streamed plain = Generate(fast_->stub(), Greedy("Once upon a time", 8));
  ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
  EXPECT_EQ(plain.last.usage().policy(), "full");
  EXPECT_EQ(plain.last.usage().kv_budget_tokens(), 0);
  v1::GenerateRequest req = Greedy("Once upon a time", 40);
  req.mutable_kv()->set_policy("h2o");
  req.mutable_kv()->set_budget_tokens(12);
  Streamed h2o = Generate(fast_->stub(), req);
  ASSERT_TRUE(h2o.status.ok()) << h2o.status.error_message();
  EXPECT_EQ(h2o.last.usage().policy(), "h2o");
  EXPECT_EQ(h2o.last.usage().kv_budget_tokens(), 12);
  EXPECT_EQ(h2o.last.usage().kv_tokens_kept(), 12);
  req.mutable_kv()->clear_budget_tokens();
  req.mutable_kv()->set_budget_fraction(0.5);
  Streamed fraction = Generate(fast_->stub(), req);
  ASSERT_TRUE(fraction.status.ok()) << fraction.status.error_message();
  const int32_t length = fraction.last.usage().prompt_tokens() + 40;
  EXPECT_EQ(fraction.last.usage().kv_budget_tokens(), length / 2) << "length " << length;
  EXPECT_EQ(fraction.last.usage().kv_dtype(), "fp32");  // the pool's
  // A request's own K/V type (narrower than the pool's fp32 pages) and MiKV's demoted store.
  req.mutable_kv()->set_dtype("int8");
  req.mutable_kv()->set_policy("h2o:demote=int4");
  Streamed int8 = Generate(fast_->stub(), req);
  ASSERT_TRUE(int8.status.ok()) << int8.status.error_message();
  EXPECT_EQ(int8.last.usage().kv_dtype(), "int8");
  EXPECT_EQ(int8.last.usage().completion_tokens(), 40);
  req.mutable_kv()->set_dtype("bf16");  // wider than nothing here, but not the pool's own
  Streamed bf16 = Generate(fast_->stub(), req);
  EXPECT_EQ(bf16.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  req.mutable_kv()->set_dtype("int3");
  Streamed bad = Generate(fast_->stub(), req);
  EXPECT_EQ(bad.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(bad.status.error_message().find("auto, fp32, bf16, int8 or int4"), std::string::npos)
      << bad.status.error_message();
}

TEST_F(ServerE2eTest, FullQueueIsResourceExhausted) {
  // --max-running 1 --max-waiting 1: one runs, one waits, the third is refused.
  grpc::ClientContext running_ctx, waiting_ctx;
  auto running = slow_->stub().Generate(&running_ctx, Long());
  v1::GenerateResponse m;
  ASSERT_TRUE(running->Read(&m));
  auto waiting = slow_->stub().Generate(&waiting_ctx, Long());
  for (auto until = std::chrono::steady_clock::now() + 5s;
       slow_->Stats().sequences_waiting() < 1 && std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(2ms);
  }
  ASSERT_EQ(slow_->Stats().sequences_waiting(), 1);
  const std::string rejected = "heavykv_request_rejected_total{code=\"RESOURCE_EXHAUSTED\"}";
  const double rejected_before = slow_->Metrics()[rejected];
  Streamed refused = Generate(slow_->stub(), Long());
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.status.error_message().find("queue"), std::string::npos);
  EXPECT_EQ(slow_->Metrics()[rejected] - rejected_before, 1.0);
  running_ctx.TryCancel();
  waiting_ctx.TryCancel();
  while (running->Read(&m)) {
  }
  while (waiting->Read(&m)) {
  }
  running->Finish();
  waiting->Finish();
  EXPECT_EQ(slow_->WaitIdle().pages_used(), 0);
}

TEST_F(ServerE2eTest, MetricsAgreeWithCacheStats) {
  // An h2o request with a 32-token budget holds a constant number of pages while it decodes.
  v1::GenerateRequest req = Long();
  req.mutable_kv()->set_policy("h2o");
  req.mutable_kv()->set_budget_tokens(32);
  grpc::ClientContext context;
  auto reader = slow_->stub().Generate(&context, req);
  v1::GenerateResponse m;
  for (int i = 0; i < 100 && reader->Read(&m); ++i) {
  }
  std::map<std::string, double> metrics = slow_->Metrics();
  v1::CacheStats stats = slow_->Stats();
  EXPECT_EQ(metrics["heavykv_kv_pages_total"], stats.pages_total());
  EXPECT_EQ(metrics["heavykv_kv_pages_used"], stats.pages_used());
  EXPECT_EQ(metrics["heavykv_kv_bytes_per_token"], stats.bytes_per_token());
  // No demoted store nor request type of its own here: the gauges exist and say 0.
  ASSERT_EQ(metrics.count("heavykv_kv_pages_demoted"), 1u);
  ASSERT_EQ(metrics.count("heavykv_kv_pages_packed"), 1u);
  EXPECT_EQ(metrics["heavykv_kv_pages_demoted"], stats.pages_demoted());
  EXPECT_EQ(stats.pages_packed(), 0);
  EXPECT_EQ(stats.kv_dtype(), "fp32");
  EXPECT_GT(stats.bytes_per_token(), 0);
  EXPECT_EQ(stats.pages_used(), 2 * 4);  // ceil(32 / 16) between steps, for each of 4 layers
  EXPECT_EQ(metrics["heavykv_requests_running"], 1);
  EXPECT_EQ(stats.sequences_running(), 1);
  EXPECT_DOUBLE_EQ(metrics["heavykv_kv_cache_usage_ratio"],
                   double(stats.pages_used()) / stats.pages_total());
  context.TryCancel();
  while (reader->Read(&m)) {
  }
  reader->Finish();
  stats = slow_->WaitIdle();
  metrics = slow_->Metrics();
  EXPECT_EQ(metrics["heavykv_kv_pages_used"], 0);
  EXPECT_EQ(metrics["heavykv_requests_running"], 0);
  EXPECT_GT(stats.tokens_evicted(), 0);
  EXPECT_EQ(metrics["heavykv_kv_tokens_evicted_total{policy=\"h2o\"}"], stats.tokens_evicted());
  // At least the 100 tokens read (the engine may have run no further before the cancel when the
  // machine is loaded).
  EXPECT_GE(metrics["heavykv_generation_tokens_total"], 100);
  EXPECT_GT(metrics["heavykv_time_to_first_token_seconds_count"], 0);
  EXPECT_GE(metrics["heavykv_iteration_tokens_count"], 100);
}

TEST_F(ServerE2eTest, BenchReportsEveryRequest) {
  const std::string out =
      RunCapture(Bin() + " bench --server " + fast_->address() +
                 " --concurrency 4 --requests 8 --prompt-tokens 16 --max-tokens 16 --json");
  EXPECT_NE(out.find("\"ok\":8,\"failed\":0,"), std::string::npos) << out;
  EXPECT_NE(out.find("\"completion_tokens\":128,"), std::string::npos) << out;  // ignore_eos
  EXPECT_NE(out.find("\"max_running\":"), std::string::npos) << out;
  EXPECT_EQ(out.find("\r"), std::string::npos) << "no progress bar without a terminal";
}

// SIGTERM: health turns NOT_SERVING while running requests get --grace to finish; the rest are
// cancelled with a last message, and the server exits 0.
TEST(ServerDrainTest, SigtermDrainsThenCancels) {
  testing::TempDir dir;
  const std::string model = SlowModel(dir);
  ServerProcess server({"--model", model, "--threads", "1", "--grace", "1", "--kv-pages", "512"});
  ASSERT_TRUE(server.ok()) << server.log();
  ASSERT_EQ(server.Health(), HealthCheckResponse::SERVING);
  grpc::ClientContext context;
  auto reader = server.stub().Generate(&context, Long());
  v1::GenerateResponse m;
  ASSERT_TRUE(reader->Read(&m));
  std::thread stop([&] { EXPECT_EQ(server.SignalAndWait(SIGTERM, 20s), 0) << server.log(); });
  std::this_thread::sleep_for(300ms);  // inside the 1 s grace
  EXPECT_EQ(server.Health(), HealthCheckResponse::NOT_SERVING);
  Streamed refused = Generate(server.stub(), Long());
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  v1::GenerateResponse last;
  while (reader->Read(&m)) last = m;
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_CANCELLED);
  EXPECT_GT(last.usage().completion_tokens(), 0);
  EXPECT_LT(last.usage().completion_tokens(), 2000);
  stop.join();
}

// A SIGTERM delivered to any thread, including those OpenBLAS starts when it loads (before
// serve can mask signals), drains the server: a rolling upgrade must never kill it outright.
TEST(ServerDrainTest, SigtermToAnyThreadDrains) {
  ServerProcess server({"--model", testing::ModelPath(), "--tokenizer", testing::TokenizerPath(),
                        "--grace", "1"});
  ASSERT_TRUE(server.ok()) << server.log();
  EXPECT_EQ(server.SignalAndWait(SIGTERM, 20s, /*every_thread=*/true), 0) << server.log();
  EXPECT_NE(server.log().find("draining"), std::string::npos) << server.log();
}

// --max-connection-age: a stream open when the connection ages out runs to completion, and the
// channel reconnects for the next call.
TEST(ServerConnectionAgeTest, StreamsOutliveTheConnectionAge) {
  testing::TempDir dir;
  const std::string model = SlowModel(dir);
  ServerProcess server({"--model", model, "--threads", "1", "--max-connection-age", "0.5"});
  ASSERT_TRUE(server.ok()) << server.log();
  v1::GenerateRequest req = Long();
  req.set_max_new_tokens(1500);  // about 1.5 s on one thread: well past the 0.5 s age
  const auto t0 = std::chrono::steady_clock::now();
  Streamed first = Generate(server.stub(), req);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message() << server.log();
  EXPECT_EQ(first.ids.size(), 1500u);
  EXPECT_GT(std::chrono::steady_clock::now() - t0, 600ms) << "the stream did not outlive the age";
  req.set_max_new_tokens(5);
  Streamed second = Generate(server.stub(), req);
  EXPECT_TRUE(second.status.ok()) << second.status.error_message();
  EXPECT_EQ(second.ids.size(), 5u);
}

// Prompt logprobs over gRPC (issue 44): max_new_tokens 0 scores the prompt alone, and
// `heavykv generate --prompt-logprobs N` prints one line per prompt token: id, log-probability
// ("-" for the first), then the N most likely as id:logprob.
TEST_F(ServerE2eTest, GeneratePrintsThePromptsLogprobs) {
  const std::string prompt = "Once upon a time";
  v1::GenerateRequest req = Greedy(prompt, 0);
  req.set_prompt_logprobs(2);
  Streamed s = Generate(fast_->stub(), req);
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_TRUE(s.ids.empty());
  EXPECT_EQ(s.last.finish_reason(), v1::FINISH_REASON_LENGTH);
  const v1::PromptLogprobs& p = s.prompt_logprobs;
  ASSERT_EQ(p.token_ids_size(), s.last.usage().prompt_tokens());
  ASSERT_EQ(p.top_size(), p.token_ids_size());
  const std::string out = RunCapture(Bin() + " generate --server " + fast_->address() +
                                     " --prompt-logprobs 2 --max-tokens 0 '" + prompt +
                                     "' 2>/dev/null");
  std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), size_t(p.token_ids_size())) << out;
  EXPECT_EQ(lines[0], absl::StrCat(p.token_ids(0), "\t-"));
  for (int i = 1; i < p.token_ids_size(); ++i) {
    std::vector<std::string> fields = absl::StrSplit(lines[size_t(i)], '\t');
    ASSERT_EQ(fields.size(), 4u) << lines[size_t(i)];
    EXPECT_EQ(fields[0], absl::StrCat(p.token_ids(i)));
    EXPECT_EQ(fields[1], absl::StrCat(p.logprobs(i)));
    EXPECT_EQ(fields[2], absl::StrCat(p.top(i).token_ids(0), ":", p.top(i).logprobs(0)));
  }
  // Without prompt_logprobs, 0 new tokens stays refused.
  EXPECT_EQ(Generate(fast_->stub(), Greedy(prompt, 0)).status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace heavykv
