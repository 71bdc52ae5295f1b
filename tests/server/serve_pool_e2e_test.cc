// How `serve` sizes its KV pool (issue 42; docs/ARCHITECTURE.md, "KV pool sizing"): with no pool
// flag the CPU pool takes --kv-memory-fraction of the memory left after the weights, at most
// --max-running full contexts; --max-model-len shortens the context; every pool error names the
// flags that change it and `heavykv plan`'s figure.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "tests/server/server_harness.h"

namespace heavykv {
namespace {

using namespace heavykv::e2e;

void ExpectNamesThePoolFlags(const std::string& out) {
  for (const char* flag : {"--kv-memory-fraction", "--kv-pool-mb", "--kv-pages", "--max-model-len",
                           "--max-running", "heavykv plan"}) {
    EXPECT_NE(out.find(flag), std::string::npos) << flag << " not in: " << out;
  }
}

TEST(ServeFlagsTest, KvMemoryFractionOutsideZeroToOneIsAFlagError) {
  testing::TempDir dir;
  for (const std::string v : {"0", "-0.5", "1.01", "nan", "inf"}) {
    const Outcome o = ServeToExit(dir, testing::ModelPath(), "--kv-memory-fraction " + v);
    EXPECT_EQ(o.code, "2\n") << v << ": " << o.out;
    EXPECT_NE(o.out.find("--kv-memory-fraction must be in (0, 1]"), std::string::npos)
        << v << ": " << o.out;
  }
}

TEST(ServeFlagsTest, MaxModelLenAboveTheModelsContextIsAFlagError) {
  testing::TempDir dir;
  const ModelConfig c = *ReadModelConfig(testing::ModelPath());
  const Outcome o =
      ServeToExit(dir, testing::ModelPath(), "--max-model-len " + std::to_string(c.seq_len + 1));
  EXPECT_EQ(o.code, "2\n") << o.out;
  EXPECT_NE(o.out.find("is more than the model's context length " + std::to_string(c.seq_len)),
            std::string::npos)
      << o.out;
  EXPECT_EQ(ServeToExit(dir, testing::ModelPath(), "--max-model-len -1").code, "2\n");
  // An explicit prompt limit must fit the shorter context too.
  const Outcome prompt =
      ServeToExit(dir, testing::ModelPath(), "--max-model-len 64 --max-prompt-tokens 64");
  EXPECT_EQ(prompt.code, "2\n") << prompt.out;
  EXPECT_NE(prompt.out.find("--max-prompt-tokens 64 leaves no room in --max-model-len 64"),
            std::string::npos)
      << prompt.out;
}

// A pool that does not fit names the flags that change it and the --kv-pool-mb that `heavykv
// plan` gives for --max-running full contexts (the same figure, from the same code).
TEST(ServeFlagsTest, PoolErrorsNameTheFlagsAndPlansFigure) {
  testing::TempDir dir;
  const std::string plan = RunCapture(Bin() + " plan --model " + testing::ModelPath() +
                                      " --max-len 128 --max-running 8 --json");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(plan, m, std::regex("\"pool_mb_for_max_running\":(\\d+)")))
      << plan;
  const std::string figure = "--kv-pool-mb " + m[1].str() + " for 8 full contexts of 128 tokens";
  for (const std::string flags : {"--kv-pool-mb 100000000", "--kv-pages 2000000000",
                                  "--kv-memory-fraction 1e-12", "--kv-pages 1"}) {
    const Outcome o =
        ServeToExit(dir, testing::ModelPath(), "--max-model-len 128 --max-running 8 " + flags);
    EXPECT_EQ(o.code, "2\n") << flags << ": " << o.out;
    EXPECT_EQ(o.out.find("listening"), std::string::npos) << flags << ": " << o.out;
    ExpectNamesThePoolFlags(o.out);
    EXPECT_NE(o.out.find(figure), std::string::npos) << flags << ": " << o.out;
  }
}

TEST(ServeFlagsTest, MaxModelLenShortensTheContextAndThePool) {
  const ModelConfig c = *ReadModelConfig(testing::ModelPath());
  ASSERT_GT(c.seq_len, 64);
  ServerProcess s({"--model", testing::ModelPath(), "--threads", "1", "--max-model-len", "64",
                   "--max-running", "4"});
  ASSERT_TRUE(s.ok()) << s.log();
  const std::string log = s.log();
  EXPECT_NE(log.find("context 64 of " + std::to_string(c.seq_len) + " (--max-model-len)"),
            std::string::npos)
      << log;
  // The cap: 4 full contexts of 64 tokens, 4 pages of 16 slots per layer each.
  EXPECT_NE(log.find("full-length sequences of 64 tokens"), std::string::npos) << log;
  EXPECT_EQ(s.Stats().pages_total(), 4 * c.num_layers * 4) << log;
  // A prompt of more than 64 - 1 tokens is refused.
  v1::GenerateRequest req = Greedy("", 4);
  for (int i = 0; i < 70; ++i) req.mutable_prompt_token_ids()->add_ids(1 + i % 100);
  EXPECT_EQ(Generate(s.stub(), req).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// Issue 42's "done when": a GGUF model whose --max-running (64) full contexts need more than this
// machine's memory starts with no pool flag; the pool holds what the fraction gives, and is not
// resident until written (the server's resident set stays small).
TEST(ServeStartupTest, GgufModelStartsWithNoPoolFlagAndLogsWhatThePoolHolds) {
  testing::TempDir dir;
  const int64_t available = ProcKiBField("/proc/meminfo", "MemAvailable");
  if (available <= 0) GTEST_SKIP() << "no MemAvailable in /proc/meminfo";
  // 2 layers x 2 kv heads x (2 x 256 x 4 B + 8 B of pos and score): 8224 B per token, fp32.
  constexpr int64_t kBytesPerToken = 2 * 2 * (2 * 256 * 4 + 8);
  int64_t context = 4096;
  while (64 * context * kBytesPerToken <= available) context *= 2;
  const std::string model = dir.File("wide.gguf");
  ASSERT_EQ(RunCapture(Bin() + " make-model --format gguf --arch llama --dim 512 --hidden-dim 64 "
                               "--layers 2 --heads 2 --kv-heads 2 --vocab 260 --seq-len " +
                       std::to_string(context) + " --out " + model + " > /dev/null; echo $?"),
            "0\n");
  ServerProcess s({"--model", model, "--threads", "1"});
  ASSERT_TRUE(s.ok()) << s.log();
  const std::string log = s.log();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      log, m,
      std::regex("KV pool on cpu: (\\d+) pages x 16 tokens \\([0-9.]+ MiB\\): (\\d+) tokens, "
                 "(\\d+) full-length sequences of (\\d+) tokens; sized by --kv-memory-fraction "
                 "0.5 of [0-9.]+ GiB available after the weights")))
      << log;
  const int64_t pages = std::stoll(m[1]), tokens = std::stoll(m[2]), sequences = std::stoll(m[3]);
  EXPECT_EQ(std::stoll(m[4]), context);
  EXPECT_EQ(tokens, pages * 16 / 2);  // a page holds one layer's 16 slots
  EXPECT_GE(sequences, 1);
  EXPECT_LT(sequences, 64);  // the old default, 64 full contexts, would not have fit
  EXPECT_EQ(sequences, tokens / context);
  // About half the available memory, untouched: the resident set stays far below it.
  EXPECT_GT(tokens * kBytesPerToken, available / 4);
  EXPECT_LE(tokens * kBytesPerToken, available / 2 + (int64_t(1) << 30));
  const int64_t rss = ProcKiBField("/proc/" + std::to_string(s.pid()) + "/status", "VmRSS");
  EXPECT_LT(rss, int64_t(1) << 30) << "resident " << rss << " bytes";
  EXPECT_EQ(s.Stats().pages_total(), pages);
}

}  // namespace
}  // namespace heavykv
