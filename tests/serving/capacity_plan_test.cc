// Capacity plan tests: the arithmetic on a real shape (stories110M, 4 GiB, the numbers
// docs/DEPLOY.md shows), and the plan against what a real Scheduler over a real KvCache admits:
// sequences are enqueued beyond the plan's capacity and stepped the way the engine steps them
// (Reserve each chunk, Commit, advance, append a token); the most that ever run at once must be
// exactly the plan's `running`, with the rest still waiting. Then `heavykv plan`, the command
// that prints it, on a named shape and on the bundled checkpoint's header.
#include "engine/serving/capacity_plan.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/model/make_model.h"
#include "engine/runner/model_runner.h"
#include "engine/serving/scheduler.h"
#include "gtest/gtest.h"
#include "memory/eviction_policy.h"
#include "memory/kv_cache.h"
#include "tests/test_util.h"

namespace heavykv {
namespace {

KvBudget Budget(const char* text) { return *KvBudget::Parse(text); }

TEST(CapacityPlanTest, Stories110MIn4GiB) {
  const ModelConfig c = *NamedShape("stories110M");
  const KvShape shape = KvShapeFor(c, 16);
  CapacityPlanInput in;
  in.shape = shape;
  in.num_pages = KvCache::PagesForBytes(shape, int64_t{4096} << 20);
  in.max_len = c.seq_len;
  absl::StatusOr<CapacityPlan> plan = PlanCapacity(in, {Budget("0.2"), Budget("0.5")});
  ASSERT_TRUE(plan.ok()) << plan.status();
  // 12 layers x 12 kv heads x (2 x 64 floats + int32 pos + float score); a page holds one
  // layer's 16 slots.
  constexpr int32_t L = 12;
  EXPECT_EQ(plan->bytes_per_token, L * 12 * (2 * 64 * 4 + 8));
  EXPECT_EQ(plan->page_bytes, shape.PageBytes());
  EXPECT_EQ(plan->page_bytes, 16 * 12 * (2 * 64 * 4 + 8));
  const int32_t pages = (int64_t{4096} << 20) / plan->page_bytes;
  EXPECT_EQ(plan->num_pages, pages);
  ASSERT_EQ(plan->rows.size(), 3u);
  const CapacityRow& full = plan->rows[0];
  EXPECT_FALSE(full.bounded);
  EXPECT_EQ(full.tokens_kept, 1024);
  EXPECT_EQ(full.pages_per_sequence, L * 64);
  EXPECT_EQ(full.reserve_pages, 0);
  EXPECT_EQ(full.sequences, 56);
  EXPECT_EQ(full.running, 56);
  EXPECT_EQ(full.pages_for_max_running, 64 * L * 64);
  const CapacityRow& b20 = plan->rows[1];
  EXPECT_TRUE(b20.bounded);
  EXPECT_EQ(b20.tokens_kept, 204);
  EXPECT_EQ(b20.pages_per_sequence, L * 13);  // ceil(205 / 16) per layer
  EXPECT_EQ(b20.reserve_pages, L * 36);       // ceil(512 / 16) + 4 per layer
  EXPECT_EQ(b20.sequences, (pages - L * 36) / (L * 13));
  EXPECT_EQ(b20.sequences, 272);
  EXPECT_EQ(b20.running, 64);
  EXPECT_EQ(b20.pages_for_max_running, 64 * L * 13 + L * 36);
  const CapacityRow& b50 = plan->rows[2];
  EXPECT_EQ(b50.tokens_kept, 512);
  EXPECT_EQ(b50.pages_per_sequence, L * 33);
  EXPECT_EQ(b50.sequences, (pages - L * 36) / (L * 33));
}

TEST(CapacityPlanTest, BudgetsThatKeepEverythingAreTheFullCache) {
  CapacityPlanInput in;
  in.shape = {2, 2, 8, 16};
  in.num_pages = 100;
  in.max_len = 256;
  absl::StatusOr<CapacityPlan> plan = PlanCapacity(in, {Budget("1"), Budget("256"), Budget("999")});
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const CapacityRow& row : plan->rows) {
    EXPECT_FALSE(row.bounded);
    EXPECT_EQ(row.tokens_kept, 256);
    EXPECT_EQ(row.pages_per_sequence, 16);
    EXPECT_EQ(row.sequences, 6);
  }
}

TEST(CapacityPlanTest, RejectsNonPositiveInputs) {
  CapacityPlanInput in;
  in.shape = {2, 2, 8, 16};
  in.num_pages = 100;
  in.max_len = 256;
  EXPECT_TRUE(PlanCapacity(in, {}).ok());
  CapacityPlanInput bad = in;
  bad.num_pages = 0;
  EXPECT_EQ(PlanCapacity(bad, {}).status().code(), absl::StatusCode::kInvalidArgument);
  bad = in;
  bad.shape.num_kv_heads = 0;
  EXPECT_EQ(PlanCapacity(bad, {}).status().code(), absl::StatusCode::kInvalidArgument);
  bad = in;
  bad.max_len = 0;
  EXPECT_EQ(PlanCapacity(bad, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

// Steps a real Scheduler over a real pool with more sequences than fit, every one bounded by
// `budget` (or full when it keeps everything), and returns the most that ran at once.
int32_t MostRunning(const CapacityPlanInput& in, int32_t tokens_kept, int32_t num_sequences,
                    int32_t* still_waiting) {
  std::unique_ptr<KvCache> cache = *KvCache::Create(in.shape, in.num_pages);
  std::unique_ptr<EvictionPolicy> window =
      *MakePolicy("window", 0.5, in.granularity, in.layers);
  SchedulerConfig config;
  config.max_step_tokens = in.max_step_tokens;
  config.max_running = in.max_running;
  Scheduler sched(cache.get(), config);
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (int32_t i = 0; i < num_sequences; ++i) {
    auto s = std::make_unique<Sequence>();
    s->id = i + 1;
    s->tokens.assign(3, 7);  // a short prompt: every sequence reaches decode within the run
    s->num_prompt = 3;
    s->max_total = in.max_len;
    if (tokens_kept < in.max_len) {
      s->kv.policy = window.get();
      s->kv.budget = tokens_kept;
    }
    sched.Enqueue(s.get());
    seqs.push_back(std::move(s));
  }
  int32_t most = 0;
  // Fewer steps than a sequence's length: none finishes, so the running set only grows.
  for (int32_t step = 0; step < in.max_len - 8; ++step) {
    StepPlan plan = sched.Schedule();
    for (const ScheduledChunk& c : plan.chunks) {
      EXPECT_TRUE(cache->Reserve(c.seq->kv, c.count).ok()) << "the scheduler overcommitted";
    }
    for (const ScheduledChunk& c : plan.chunks) {
      cache->CommitStep(c.seq->kv, c.count);
      c.seq->num_computed += c.count;
      if (c.samples) c.seq->tokens.push_back(7);
    }
    most = std::max(most, sched.num_running());
  }
  *still_waiting = sched.num_waiting();
  return most;
}

TEST(CapacityPlanTest, AgreesWithTheScheduler) {
  for (EvictGranularity g : {EvictGranularity::kToken, EvictGranularity::kPage}) {
  SCOPED_TRACE(EvictGranularityName(g));
  CapacityPlanInput in;
  in.granularity = g;
  in.shape = {1, 1, 4, 4};  // 1 layer, 1 kv head, head_dim 4, block 4
  in.max_len = 64;
  in.max_step_tokens = 48;  // reserve: 12 + 4 pages
  const std::vector<KvBudget> budgets = {Budget("0.25"), Budget("0.5"), Budget("10"), Budget("63")};
  // Pools on both sides of rows' boundaries; at 200 pages max_running binds, at 250 the step's
  // token limit does (every running sequence decodes one token per step).
  for (int32_t pages : {16, 17, 20, 21, 47, 48, 63, 64, 100, 112, 113, 200, 250}) {
    in.num_pages = pages;
    in.max_running = pages == 200 ? 12 : 60;
    absl::StatusOr<CapacityPlan> plan = PlanCapacity(in, budgets);
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (const CapacityRow& row : plan->rows) {
      SCOPED_TRACE(::testing::Message() << pages << " pages, budget " << row.budget.ToString());
      const int32_t offered = static_cast<int32_t>(row.running) + 3;
      int32_t waiting = 0;
      const int32_t most = MostRunning(in, row.tokens_kept, offered, &waiting);
      if (row.sequences == 0) {
        // Not even one fits: the validator refuses such a request (Scheduler::Fits) before the
        // scheduler sees it; a bounded one would wait forever.
        ASSERT_TRUE(row.bounded);
        EXPECT_EQ(most, 0);
        continue;
      }
      EXPECT_EQ(most, row.running);
      EXPECT_EQ(waiting, offered - row.running);
    }
  }
  }
}

// Page granularity holds a page more per bounded sequence (PeakDecodeSlots), never more than
// the sequence's own length.
TEST(CapacityPlanTest, PageGranularityCountsAPageMore) {
  KvShape one{12, 12, 64, 16};  // one table for all layers
  EXPECT_EQ(PagesPerSequence(one, 1024, 204), 13);  // 205 slots
  EXPECT_EQ(PagesPerSequence(one, 1024, 204, EvictGranularity::kPage), 14);  // 220
  EXPECT_EQ(PagesPerSequence(one, 1024, 208, EvictGranularity::kPage), 14);  // 224
  EXPECT_EQ(PagesPerSequence(one, 210, 204, EvictGranularity::kPage), 14);   // 210
  EXPECT_EQ(PagesPerSequence(one, 1024, 1024, EvictGranularity::kPage), 64);
  KvShape per_layer = one;  // the same per table, for each of the 12
  per_layer.table_per_layer = true;
  EXPECT_EQ(PagesPerSequence(per_layer, 1024, 204), 12 * 13);
  EXPECT_EQ(PagesPerSequence(per_layer, 1024, 204, EvictGranularity::kPage), 12 * 14);
  EXPECT_EQ(PagesPerSequence(per_layer, 1024, 1024), 12 * 64);
}

// Runs `heavykv ARGS`; stdout, and the exit code in *code.
// stdout (and stderr too with `with_stderr`) of `heavykv args`; *code is its exit code.
std::string Heavykv(const std::string& args, int* code, bool with_stderr = false) {
  std::string out;
  const std::string err = with_stderr ? " 2>&1" : " 2>/dev/null";
  std::FILE* p = popen((std::string(HEAVYKV_BINARY) + " " + args + err).c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

TEST(PlanCommandTest, PrintsThePlanAsJson) {
  int code = 0;
  const std::string out =
      Heavykv("plan --shape stories110M --kv-pool-mb 4096 --kv-budget 0.2,0.5 --json", &code);
  ASSERT_EQ(code, 0) << out;
  for (const char* field :
       {"\"bytes_per_token\":74880", "\"page_bytes\":99840", "\"pages\":43018",
        "{\"budget\":\"full\",\"tokens_kept\":1024,\"bounded\":false,\"pages_per_sequence\":768,"
        "\"reserve_pages\":0,\"sequences\":56,\"running\":56",
        "{\"budget\":\"0.2\",\"tokens_kept\":204,\"bounded\":true,\"pages_per_sequence\":156,"
        "\"reserve_pages\":432,\"sequences\":272,\"running\":64,"
        "\"pages_for_max_running\":10416,\"pool_mb_for_max_running\":992}"}) {
    EXPECT_NE(out.find(field), std::string::npos) << field << " not in " << out;
  }
}

TEST(PlanCommandTest, ReadsTheCheckpointHeader) {
  int code = 0;
  // stories260K: 5 layers x 4 kv heads x head_dim 8, context 512; the default pool is serve's
  // (--max-running 64 full contexts = 64 x 5 layers x 32 pages).
  const std::string out =
      Heavykv("plan --json --kv-budget 0.25 --model " + testing::ModelPath(), &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("\"bytes_per_token\":1440,"), std::string::npos) << out;
  EXPECT_NE(out.find("\"pages\":10240,"), std::string::npos) << out;
  EXPECT_NE(out.find("\"budget\":\"full\",\"tokens_kept\":512,\"bounded\":false,"
                     "\"pages_per_sequence\":160,\"reserve_pages\":0,\"sequences\":64"),
            std::string::npos)
      << out;
}

TEST(PlanCommandTest, CudaKeepsBf16KvAndNeedsAPoolSize) {
  int code = 0;
  const std::string out =
      Heavykv("plan --shape stories110M --device cuda --kv-pool-mb 4096 --json", &code);
  ASSERT_EQ(code, 0) << out;
  // 12 layers x 12 kv heads x (2 x 64 x 2 B + 8 B).
  EXPECT_NE(out.find("\"bytes_per_token\":38016,"), std::string::npos) << out;
  EXPECT_NE(out.find("\"kv_dtype\":\"bf16\","), std::string::npos) << out;
  Heavykv("plan --shape stories110M --device cuda", &code);  // serve sizes it from the GPU
  EXPECT_EQ(code, 2);
}

// --kv-dtype bf16 on the CPU: the same bf16 pages as CUDA, so twice the sequences in the pool;
// fp32 K/V on CUDA and unknown types are rejected, as by run, eval and serve (DtypeFlags).
TEST(PlanCommandTest, Bf16KvOnTheCpuHalvesTheBytesPerToken) {
  int code = 0;
  std::string out = Heavykv("plan --shape stories110M --kv-pool-mb 4096 --json", &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("\"bytes_per_token\":74880,"), std::string::npos) << out;
  out = Heavykv("plan --shape stories110M --kv-dtype bf16 --kv-pool-mb 4096 --json", &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("\"bytes_per_token\":38016,"), std::string::npos) << out;
  EXPECT_NE(out.find("\"kv_dtype\":\"bf16\","), std::string::npos) << out;
  out = Heavykv("plan --shape stories110M --kv-dtype fp32 --device cuda --kv-pool-mb 64", &code,
                true);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("stores K/V in bf16"), std::string::npos) << out;
  out = Heavykv("plan --shape stories110M --kv-dtype fp8 --kv-pool-mb 64", &code, true);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("unknown KV dtype"), std::string::npos) << out;
  EXPECT_NE(out.find("auto, fp32, bf16, int8 or int4"), std::string::npos) << out;
  for (const char* cmd : {"run", "eval --text x", "serve"}) {
    out = Heavykv(std::string(cmd) + " --model " + testing::ModelPath() + " --weight-dtype fp8",
                  &code, true);
    EXPECT_EQ(code, 2) << cmd;
    EXPECT_NE(out.find("unknown weight dtype"), std::string::npos) << cmd << ": " << out;
  }
}

TEST(PlanCommandTest, RejectsAMissingShapeAndBadBudgets) {
  int code = 0;
  Heavykv("plan --kv-pool-mb 1024", &code);
  EXPECT_EQ(code, 2);
  Heavykv("plan --shape stories15M --kv-budget 1.5", &code);
  EXPECT_EQ(code, 2);
  Heavykv("plan --shape nope", &code);
  EXPECT_EQ(code, 2);
  Heavykv("plan --shape stories15M --max-len 4096", &code);  // over the context length
  EXPECT_EQ(code, 2);
}

// --kv-dtype int8 / int4 (issue 29): plan counts the real bytes of a quantized slot, scales and
// metadata included. stories110M (head_dim 64): int8 rows of 64 B + a 1 B scale, int4 rows of
// 32 B + two 2 B scales, beside bf16's 128 B; the pool holds >= 1.9x and >= 3.2x bf16's tokens.
TEST(PlanCommandTest, QuantizedKvCountsItsRealBytes) {
  auto plan = [](const std::string& dtype) {
    int code = 0;
    const std::string out = Heavykv(
        "plan --shape stories110M --kv-dtype " + dtype + " --kv-pool-mb 4096 --json", &code);
    EXPECT_EQ(code, 0) << out;
    return nlohmann::json::parse(out);
  };
  const nlohmann::json bf16 = plan("bf16"), int8 = plan("int8"), int4 = plan("int4");
  // 12 layers x 12 kv heads x (2 x (64 + 1) + 8) and x (2 x (32 + 4) + 8).
  EXPECT_EQ(int8["bytes_per_token"].get<int64_t>(), 144 * 138);
  EXPECT_EQ(int4["bytes_per_token"].get<int64_t>(), 144 * 80);
  EXPECT_EQ(int8["kv_dtype"], "int8");
  EXPECT_EQ(int4["kv_dtype"], "int4");
  const double full_bf16 = bf16["rows"][0]["sequences"].get<double>();
  EXPECT_GE(int8["rows"][0]["sequences"].get<double>(), 1.9 * full_bf16);
  EXPECT_GE(int4["rows"][0]["sequences"].get<double>(), 3.2 * full_bf16);
  int code = 0;
  const std::string out = Heavykv(
      "plan --shape stories110M --kv-dtype int8 --device cuda --kv-pool-mb 64", &code, true);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("CPU backend only"), std::string::npos) << out;
  // A pool too small for its K/V type is refused with the numbers: 1 MiB holds 10 fp32 pages of
  // stories110M's one layer (99840 bytes), fewer than its 12 layers; 39 of int8.
  std::string small = Heavykv("plan --shape stories110M --kv-pool-mb 1", &code, true);
  EXPECT_EQ(code, 2);
  EXPECT_NE(small.find("--kv-pool-mb 1 holds 10 pages of 99840 bytes"), std::string::npos)
      << small;
  EXPECT_NE(small.find("needs at least 12"), std::string::npos) << small;
  small = Heavykv("plan --shape stories110M --kv-pool-mb 1 --kv-dtype int8 --json", &code);
  EXPECT_EQ(code, 0) << small;
  EXPECT_EQ(nlohmann::json::parse(small)["pages"], 39);
  Heavykv("plan --shape stories110M --kv-pages 11", &code, true);
  EXPECT_EQ(code, 2);
}

// Issue 29: requests asking for int8/int4 rows on a bf16 pool (packed pages: 28 and 48 tokens a
// page of 16), and a demoted store (h2o's evicted tokens as int4, as many as it keeps), counted
// as the scheduler counts them (PeakPages).
TEST(PlanCommandTest, RequestTypesAndDemotedStoresCountTheirPages) {
  auto plan = [](const std::string& flags) {
    int code = 0;
    const std::string out = Heavykv(
        "plan --shape stories110M --kv-dtype bf16 --kv-pool-mb 4096 --kv-budget 0.2 --json " +
            flags,
        &code);
    EXPECT_EQ(code, 0) << out;
    return nlohmann::json::parse(out);
  };
  const nlohmann::json bf16 = plan(""), int8 = plan("--request-kv-dtype int8"),
                       int4 = plan("--request-kv-dtype int4"), demote = plan("--demote int4");
  // 12 tables x ceil(1024 / 16) = 768 pages for a full bf16 sequence; ceil(1024 / 28) = 37 and
  // ceil(1024 / 48) = 22 per table packed.
  EXPECT_EQ(bf16["rows"][0]["pages_per_sequence"], 12 * 64);
  EXPECT_EQ(int8["rows"][0]["pages_per_sequence"], 12 * 37);
  EXPECT_EQ(int4["rows"][0]["pages_per_sequence"], 12 * 22);
  EXPECT_EQ(int8["request_kv_dtype"], "int8");
  // h2o 20% keeps 204: 13 pages a table (205 slots); its store of 204 int4 tokens 5 more.
  EXPECT_EQ(bf16["rows"][1]["pages_per_sequence"], 12 * 13);
  EXPECT_EQ(demote["rows"][1]["pages_per_sequence"], 12 * (13 + 5));
  EXPECT_EQ(demote["rows"][0]["pages_per_sequence"], 12 * 64);  // full: nothing demoted
  EXPECT_GE(int8["rows"][1]["sequences"].get<double>(),
            1.6 * bf16["rows"][1]["sequences"].get<double>());
  int code = 0;
  std::string out = Heavykv("plan --shape stories110M --kv-dtype int8 --request-kv-dtype int8",
                            &code, true);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("no more tokens per page"), std::string::npos) << out;
  out = Heavykv("plan --shape stories110M --demote int2", &code, true);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("int8 or int4"), std::string::npos) << out;
  out = Heavykv("plan --shape stories110M --demote int4 --evict-granularity page", &code, true);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("demote"), std::string::npos) << out;
}

}  // namespace
}  // namespace heavykv
