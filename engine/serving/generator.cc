#include "engine/serving/generator.h"

#include <time.h>

#include <chrono>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/tokenizer.h"

namespace heavykv {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

}  // namespace

bool EndsSequence(const TextTokenizer* tokenizer, const ModelConfig& config, int32_t token) {
  return tokenizer != nullptr ? tokenizer->IsEndOfGeneration(token)
                              : token == config.bos_id || token == config.eos_id;
}

absl::StatusOr<GenerateResult> Generate(StepRunner& runner, std::span<const int32_t> prompt,
                                        const GenerateOptions& options,
                                        const std::function<void(int32_t, int32_t)>& on_token) {
  const ModelConfig& c = runner.model().config;
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt has no tokens");
  SequenceKv kv;
  kv.policy = options.policy;
  kv.budget = options.policy != nullptr ? options.budget : kUnboundedBudget;
  kv.quant = options.kv_quant;
  // Past the context only where the runner can (window and sink with a budget under it).
  const bool endless = StreamsPastContext(kv, 1, c.seq_len);
  if (options.steps < static_cast<int32_t>(prompt.size()) ||
      (options.steps > c.seq_len && !endless)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "steps ", options.steps, " must be in [prompt tokens ", prompt.size(),
        ", context length ", c.seq_len,
        "] (more only with the window or sink policy and a budget under the context)"));
  }
  if (options.prefill_chunk <= 0) {
    return absl::InvalidArgumentError("prefill chunk must be positive");
  }

  absl::Cleanup release = [&] { runner.cache().Release(kv); };

  GenerateResult result;
  result.tokens.assign(prompt.begin(), prompt.end());
  result.num_prompt_tokens = static_cast<int32_t>(prompt.size());
  for (size_t i = 1; i < prompt.size(); ++i) on_token(prompt[i - 1], prompt[i]);

  Sampler sampler(options.sampling, prompt);
  std::vector<float> logits(c.vocab_size);
  auto t0 = std::chrono::steady_clock::now();
  int32_t pos = 0;
  // Prefill: the prompt in chunks; the last chunk's logits give the first new token.
  std::span<const float> out;
  while (pos < static_cast<int32_t>(prompt.size())) {
    int32_t n = std::min<int32_t>(options.prefill_chunk, prompt.size() - pos);
    // A chunk that runs past the context must leave the budget room within it.
    if (endless && pos + n > c.seq_len) n = std::max(1, std::min(n, c.seq_len - kv.budget));
    SequenceStep step{&kv, prompt.subspan(pos, n), pos, false};
    absl::StatusOr<std::span<const float>> r = runner.Forward({&step, 1});
    if (!r.ok()) return r.status();
    out = *r;
    pos += n;
  }
  result.prefill_seconds = SecondsSince(t0);
  t0 = std::chrono::steady_clock::now();
  const double cpu0 = ProcessCpuSeconds();
  result.finish_reason = "length";
  while (true) {
    logits.assign(out.begin(), out.end());
    const int32_t next = sampler.Sample(logits);
    if (!options.ignore_eos && EndsSequence(options.tokenizer, c, next)) {
      result.finish_reason = "eos";
      break;
    }
    on_token(result.tokens.back(), next);
    result.tokens.push_back(next);
    sampler.Accept(next);
    if (pos >= options.steps) break;  // run.c runs the model at positions [0, steps)
    SequenceStep step{&kv, {&result.tokens.back(), 1}, pos, false};
    absl::StatusOr<std::span<const float>> r = runner.Forward({&step, 1});
    if (!r.ok()) return r.status();
    out = *r;
    ++pos;
  }
  result.decode_seconds = SecondsSince(t0);
  result.decode_cpu_seconds = ProcessCpuSeconds() - cpu0;
  result.peak_pages = kv.peak_pages;
  result.tokens_evicted = kv.tokens_evicted;
  return result;
}

}  // namespace heavykv
