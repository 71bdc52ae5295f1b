#include "engine/eval/passkey.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"
#include "engine/runner/step_runner.h"
#include "engine/serving/generator.h"
#include "memory/eviction_policy.h"

namespace heavykv {
namespace {

constexpr absl::string_view kIntro =
    "There is an important piece of information hidden inside a lot of irrelevant text. Find it "
    "and memorize it. I will quiz you about the important information there.\n";
constexpr absl::string_view kFiller =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ";
constexpr absl::string_view kQuestion = "\nWhat is the pass key? The pass key is";

std::string PromptText(const std::string& key, double depth, int32_t fillers) {
  const int32_t before = static_cast<int32_t>(std::lround(depth * fillers));
  std::string text(kIntro);
  for (int32_t i = 0; i < fillers; ++i) {
    if (i == before) absl::StrAppend(&text, "The pass key is ", key, ". Remember it. ", key,
                                     " is the pass key. ");
    absl::StrAppend(&text, kFiller);
  }
  if (before >= fillers) {
    absl::StrAppend(&text, "The pass key is ", key, ". Remember it. ", key, " is the pass key.");
  }
  absl::StrAppend(&text, kQuestion);
  return text;
}

std::vector<int32_t> Encode(const TextTokenizer& tokenizer, const std::string& text) {
  std::optional<std::vector<int32_t>> ids =
      tokenizer.Encode(text, tokenizer.add_bos(), /*eos=*/false, nullptr, /*parse_special=*/false);
  return ids.value_or(std::vector<int32_t>());
}

// splitmix64: the keys of a run from its seed, the same on every platform.
uint64_t Mix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

absl::StatusOr<PasskeyPrompt> BuildPasskeyPrompt(const TextTokenizer& tokenizer,
                                                 const std::string& key, double depth,
                                                 int32_t target_tokens) {
  if (!(depth >= 0 && depth <= 1)) {
    return absl::InvalidArgumentError("the passkey depth must be in [0, 1]");
  }
  // The token count grows with the filler count: the largest count that fits, by bisection
  // between one sentence and the most that could fit at one token each.
  const auto tokens_for = [&](int32_t fillers) {
    return static_cast<int32_t>(Encode(tokenizer, PromptText(key, depth, fillers)).size());
  };
  if (tokens_for(1) > target_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a passkey prompt needs more than ", target_tokens, " tokens: raise --passkey-tokens"));
  }
  int32_t lo = 1, hi = std::max(1, target_tokens);
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo + 1) / 2;
    if (tokens_for(mid) <= target_tokens) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  PasskeyPrompt p;
  p.text = PromptText(key, depth, lo);
  p.tokens = Encode(tokenizer, p.text);
  p.key = key;
  p.depth = depth;
  return p;
}

bool PasskeyFound(absl::string_view answer, absl::string_view key) {
  size_t i = 0;
  while (i < answer.size() && !std::isdigit(static_cast<unsigned char>(answer[i]))) ++i;
  size_t j = i;
  while (j < answer.size() && std::isdigit(static_cast<unsigned char>(answer[j]))) ++j;
  return j > i && answer.substr(i, j - i) == key;
}

absl::StatusOr<std::vector<PasskeyResult>> RunPasskey(const Model& model,
                                                      const TextTokenizer& tokenizer,
                                                      const PasskeyOptions& options) {
  const ModelConfig& c = model.config;
  if (options.configs.empty()) return absl::InvalidArgumentError("no policy to evaluate");
  if (options.trials < 1 || options.trials > 1000) {
    return absl::InvalidArgumentError("--trials must be in [1, 1000]");
  }
  if (options.answer_tokens < 1 || options.answer_tokens >= c.seq_len) {
    return absl::InvalidArgumentError("the answer length must be in [1, context length)");
  }
  const int32_t target =
      options.prompt_tokens > 0 ? options.prompt_tokens : c.seq_len - options.answer_tokens;
  if (target + options.answer_tokens > c.seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("--passkey-tokens ", target, " plus ", options.answer_tokens,
                     " answer tokens exceed the context length ", c.seq_len));
  }

  // The same prompts for every configuration.
  std::vector<PasskeyPrompt> prompts;
  uint64_t state = options.seed;
  int32_t longest = 0;
  for (int32_t t = 0; t < options.trials; ++t) {
    const std::string key = absl::StrCat(10000 + Mix(state) % 90000);
    const double depth = options.trials == 1 ? 0.5 : double(t) / (options.trials - 1);
    absl::StatusOr<PasskeyPrompt> p = BuildPasskeyPrompt(tokenizer, key, depth, target);
    if (!p.ok()) return p.status();
    longest = std::max(longest, static_cast<int32_t>(p->tokens.size()));
    prompts.push_back(*std::move(p));
  }
  const int32_t steps = longest + options.answer_tokens;

  absl::StatusOr<KvShape> kv_shape = EvalKvShape(c, options);
  if (!kv_shape.ok()) return kv_shape.status();
  const KvShape& shape = *kv_shape;
  const int32_t pages = shape.NumTables() *
                        ((steps + options.prefill_chunk + shape.block_size - 1) / shape.block_size);
  absl::StatusOr<EvalBackend> backend =
      MakeEvalBackend(model, options.device, shape, pages, "tokens", options.gpu_weights);
  if (!backend.ok()) return backend.status();

  absl::StatusOr<std::vector<std::unique_ptr<EvictionPolicy>>> policies =
      MakeConfigPolicies(options);
  if (!policies.ok()) return policies.status();
  std::vector<PasskeyResult> results;
  for (size_t i = 0; i < options.configs.size(); ++i) {
    const EvalConfig& cfg = options.configs[i];
    const EvictionPolicy* policy = (*policies)[i].get();
    const bool full = policy == nullptr;
    PasskeyResult r;
    r.policy = cfg.policy;
    r.budget = full ? "full" : cfg.budget.ToString();
    r.budget_tokens = full ? steps : std::min(steps, cfg.budget.Resolve(steps));
    r.prompt_tokens = longest;
    for (const PasskeyPrompt& p : prompts) {
      GenerateOptions g;
      g.steps = static_cast<int32_t>(p.tokens.size()) + options.answer_tokens;
      g.sampling.temperature = 0;
      g.policy = policy;
      g.budget = full ? kUnboundedBudget : r.budget_tokens;
      g.prefill_chunk = options.prefill_chunk;
      g.tokenizer = &tokenizer;
      std::string answer;
      int32_t echoed = 0;
      const int32_t prompt_len = static_cast<int32_t>(p.tokens.size());
      absl::StatusOr<GenerateResult> out =
          Generate(*backend->runner, p.tokens, g, [&](int32_t prev, int32_t token) {
            if (++echoed < prompt_len) return;  // the prompt's own tokens
            answer += tokenizer.Decode(prev, token);
          });
      if (!out.ok()) return out.status();
      r.correct += PasskeyFound(answer, p.key);
      r.answers.push_back(std::move(answer));
      r.keys.push_back(p.key);
      ++r.trials;
    }
    r.accuracy = double(r.correct) / r.trials;
    results.push_back(std::move(r));
  }
  return results;
}

}  // namespace heavykv
