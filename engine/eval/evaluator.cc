#include "engine/eval/evaluator.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include "engine/runner/model_runner.h"
#include "engine/serving/sampler.h"

namespace heavykv {

std::string EvalResult::ToString() const {
  return absl::StrFormat(
      "%s budget %d (%s, %s K/V): ppl %.6f top1 %.6f over %d windows of %d, %d tokens", policy,
      budget_tokens, budget, kv_dtype, ppl, top1, windows, window, tokens);
}

absl::StatusOr<KvShape> EvalKvShape(const ModelConfig& config, const EvalSetup& setup) {
  if (absl::Status s = CheckKvDtype(setup.device, setup.kv_dtype); !s.ok()) return s;
  return KvShapeForDevice(setup.device, config, setup.block_size, setup.kv_dtype);
}

namespace {

// Pages one sequence under `policy` (null: full) keeping `budget` tokens holds at its peak
// (PeakPages; the full cache holds budget + 1 slots per layer during its last step).
int64_t EvalPeakPages(const KvShape& shape, const EvictionPolicy* policy, int32_t budget) {
  if (policy == nullptr) {
    return int64_t(shape.NumTables()) * ((int64_t(budget) + shape.block_size) / shape.block_size);
  }
  return PeakPages(shape, policy, budget, INT32_MAX);
}

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<EvictionPolicy>>> MakeConfigPolicies(
    const EvalSetup& setup) {
  std::vector<std::unique_ptr<EvictionPolicy>> out;
  for (const EvalConfig& cfg : setup.configs) {
    absl::StatusOr<std::unique_ptr<EvictionPolicy>> p =
        MakePolicy(cfg.policy, setup.recent_fraction);
    if (!p.ok()) return p.status();
    out.push_back(*std::move(p));
  }
  return out;
}

absl::StatusOr<EvalBackend> MakeEvalBackend(const Model& model, Device device,
                                            const KvShape& shape, int64_t pages,
                                            absl::string_view what, GpuWeights gpu_weights) {
  if (pages > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("too many ", what, " for one KV pool"));
  }
  EvalBackend b;
  absl::StatusOr<std::unique_ptr<KvCache>> cache =
      CreateKvCache(device, shape, static_cast<int32_t>(pages));
  if (!cache.ok()) return cache.status();
  b.cache = *std::move(cache);
  absl::StatusOr<std::unique_ptr<StepRunner>> runner =
      MakeStepRunner(device, model, b.cache.get(), {.gpu_weights = gpu_weights});
  if (!runner.ok()) return runner.status();
  b.runner = *std::move(runner);
  return b;
}

std::vector<int32_t> BuildEvalStream(const TextTokenizer& tokenizer, absl::string_view text) {
  std::vector<int32_t> stream;
  // A blank line is two newlines in a row (possibly with spaces between, which StripAscii drops).
  for (absl::string_view story : absl::StrSplit(text, "\n\n")) {
    story = absl::StripAsciiWhitespace(story);
    if (story.empty()) continue;
    std::vector<int32_t> ids = tokenizer.Encode(std::string_view(story.data(), story.size()),
                                                tokenizer.add_bos(), /*eos=*/false);
    stream.insert(stream.end(), ids.begin(), ids.end());
  }
  return stream;
}

absl::StatusOr<std::vector<EvalResult>> Evaluate(const Model& model,
                                                 std::span<const int32_t> stream,
                                                 const EvalOptions& options) {
  const ModelConfig& c = model.config;
  const int32_t W = options.window > 0 ? options.window : c.seq_len;
  if (W < 2 || W > c.seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("window ", W, " must be in [2, context length ", c.seq_len, "]"));
  }
  int32_t windows = static_cast<int32_t>(stream.size() / W);
  if (options.max_windows > 0) windows = std::min(windows, options.max_windows);
  if (windows == 0) {
    return absl::InvalidArgumentError(absl::StrCat("the text has ", stream.size(),
                                                   " tokens, fewer than one window of ", W));
  }
  if (options.configs.empty()) return absl::InvalidArgumentError("no policy to evaluate");
  if (options.prefill < 0 || options.prefill >= W) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefill ", options.prefill, " must be in [0, window ", W, ")"));
  }
  const int32_t prefill = std::max(1, options.prefill);

  // One sequence per (configuration, window), all stepped together.
  const size_t num_cfg = options.configs.size();
  absl::StatusOr<std::vector<std::unique_ptr<EvictionPolicy>>> made_policies =
      MakeConfigPolicies(options);
  if (!made_policies.ok()) return made_policies.status();
  const std::vector<std::unique_ptr<EvictionPolicy>>& policies = *made_policies;
  std::vector<EvalResult> results(num_cfg);
  int64_t pages = 0;
  absl::StatusOr<KvShape> kv_shape = EvalKvShape(c, options);
  if (!kv_shape.ok()) return kv_shape.status();
  const KvShape& shape = *kv_shape;
  for (size_t i = 0; i < num_cfg; ++i) {
    const EvalConfig& cfg = options.configs[i];
    EvalResult& r = results[i];
    r.policy = cfg.policy;
    r.kv_dtype = KvElementName(shape);
    const bool full = cfg.policy == "full";
    r.budget = full ? "full" : cfg.budget.ToString();
    r.budget_tokens = full ? W : std::min(W, cfg.budget.Resolve(W));
    r.window = W;
    r.windows = windows;
    r.tokens = int64_t(windows) * (W - 1);
    const int64_t peak = EvalPeakPages(shape, policies[i].get(), r.budget_tokens);
    // A prompt chunk's tokens all enter before its eviction: one table's pages for them each.
    const int64_t chunk_pages =
        prefill > 1 ? int64_t(shape.NumTables()) * ((prefill + shape.block_size - 1) /
                                                    shape.block_size)
                    : 0;
    r.kv_bytes = std::max(peak, chunk_pages) * shape.PageBytes();
    pages += int64_t(windows) * (peak + chunk_pages);
  }
  absl::StatusOr<EvalBackend> backend =
      MakeEvalBackend(model, options.device, shape, pages, "windows", options.gpu_weights);
  if (!backend.ok()) return backend.status();
  StepRunner& runner = *backend->runner;

  const size_t num_seq = num_cfg * windows;
  std::vector<SequenceKv> kv(num_seq);
  for (size_t s = 0; s < num_seq; ++s) {
    const EvalResult& r = results[s / windows];
    const bool full = r.policy == "full";
    kv[s].policy = full ? nullptr : policies[s / windows].get();
    kv[s].budget = full ? kUnboundedBudget : r.budget_tokens;
  }
  std::vector<double> nll(num_cfg, 0.0);
  std::vector<int64_t> hits(num_cfg, 0);
  std::vector<SequenceStep> steps(num_seq);
  // Step 0 feeds positions [0, prefill) (scoring each), every later step one position.
  for (int32_t pos = 0; pos + 1 < W; pos += pos == 0 ? prefill : 1) {
    const int32_t n = pos == 0 ? prefill : 1;
    for (size_t s = 0; s < num_seq; ++s) {
      const int64_t w = s % windows;
      steps[s] = SequenceStep{&kv[s], stream.subspan(w * W + pos, n), pos, n > 1};
    }
    absl::StatusOr<std::span<const float>> logits = runner.Forward(steps);
    if (!logits.ok()) return logits.status();
    for (size_t s = 0; s < num_seq; ++s) {
      for (int32_t j = 0; j < n; ++j) {
        std::span<const float> row = logits->subspan((s * n + j) * c.vocab_size, c.vocab_size);
        const int32_t target = stream[(s % windows) * W + pos + j + 1];
        nll[s / windows] -= Sampler::LogProb(row, target);
        hits[s / windows] += Sampler::Argmax(row) == target;
      }
    }
  }
  for (size_t s = 0; s < num_seq; ++s) backend->cache->Release(kv[s]);
  for (size_t i = 0; i < num_cfg; ++i) {
    results[i].ppl = std::exp(nll[i] / results[i].tokens);
    results[i].top1 = double(hits[i]) / results[i].tokens;
  }
  return results;
}

absl::StatusOr<std::vector<StreamEvalResult>> EvaluateStream(const Model& model,
                                                             std::span<const int32_t> text,
                                                             const StreamEvalOptions& options) {
  const ModelConfig& c = model.config;
  if (options.tokens < 2) return absl::InvalidArgumentError("--stream-tokens must be at least 2");
  if (options.tokens > (int64_t(1) << 30)) {
    return absl::InvalidArgumentError("--stream-tokens must be at most 2^30");
  }
  if (options.chunk < 1) return absl::InvalidArgumentError("the chunk must be at least 1 token");
  if (text.empty()) return absl::InvalidArgumentError("the text has no tokens");
  if (options.configs.empty()) return absl::InvalidArgumentError("no policy to evaluate");
  // The stream: the text's tokens, repeated (without its leading BOS) when N is longer.
  const int64_t L = static_cast<int64_t>(text.size());
  const int64_t skip = L > 1 && text[0] == c.bos_id ? 1 : 0;
  const auto token_at = [&](int64_t i) {
    return i < L ? text[i] : text[skip + (i - L) % (L - skip)];
  };

  const size_t num = options.configs.size();
  absl::StatusOr<std::vector<std::unique_ptr<EvictionPolicy>>> made_policies =
      MakeConfigPolicies(options);
  if (!made_policies.ok()) return made_policies.status();
  const std::vector<std::unique_ptr<EvictionPolicy>>& policies = *made_policies;
  std::vector<StreamEvalResult> results(num);
  std::vector<SequenceKv> kv(num);
  std::vector<int64_t> last(num);  // the last position each sequence is fed
  int64_t pages = 0;
  absl::StatusOr<KvShape> kv_shape = EvalKvShape(c, options);
  if (!kv_shape.ok()) return kv_shape.status();
  const KvShape& shape = *kv_shape;
  for (size_t i = 0; i < num; ++i) {
    const EvalConfig& cfg = options.configs[i];
    StreamEvalResult& r = results[i];
    r.policy = cfg.policy;
    const bool full = policies[i] == nullptr;
    r.budget = full ? "full" : cfg.budget.ToString();
    r.budget_tokens = full ? c.seq_len : std::min(c.seq_len, cfg.budget.Resolve(c.seq_len));
    kv[i].policy = policies[i].get();
    kv[i].budget = full ? kUnboundedBudget : r.budget_tokens;
    // Past the context where the CPU runner can (the CUDA one stops at it).
    r.past_context = options.device == Device::kCpu && StreamsPastContext(kv[i], 1, c.seq_len);
    last[i] = r.past_context ? options.tokens - 2 : std::min<int64_t>(options.tokens, c.seq_len) - 2;
    pages += EvalPeakPages(shape, policies[i].get(), r.budget_tokens);
  }
  absl::StatusOr<EvalBackend> backend =
      MakeEvalBackend(model, options.device, shape, pages, "policies", options.gpu_weights);
  if (!backend.ok()) return backend.status();
  StepRunner& runner = *backend->runner;

  std::vector<double> nll(num, 0.0), chunk_nll(num, 0.0);
  std::vector<int64_t> chunk_n(num, 0);
  std::vector<int32_t> tokens(num);
  std::vector<SequenceStep> steps;
  std::vector<size_t> live;
  for (int64_t pos = 0;; ++pos) {
    steps.clear();
    live.clear();
    for (size_t i = 0; i < num; ++i) {
      if (pos > last[i]) continue;
      tokens[i] = token_at(pos);
      steps.push_back(SequenceStep{&kv[i], {&tokens[i], 1}, static_cast<int32_t>(pos), false});
      live.push_back(i);
    }
    if (steps.empty()) break;
    if (pos > INT32_MAX - 2) return absl::InvalidArgumentError("the stream is too long");
    absl::StatusOr<std::span<const float>> logits = runner.Forward(steps);
    if (!logits.ok()) return logits.status();
    const int32_t target = token_at(pos + 1);
    for (size_t j = 0; j < live.size(); ++j) {
      const size_t i = live[j];
      const double loss = -Sampler::LogProb(logits->subspan(j * c.vocab_size, c.vocab_size), target);
      nll[i] += loss;
      chunk_nll[i] += loss;
      ++results[i].tokens;
      // A chunk ends every `chunk` predictions, and at the sequence's last one.
      if (++chunk_n[i] == options.chunk || pos == last[i]) {
        results[i].chunk_end.push_back(pos + 2);
        results[i].chunk_ppl.push_back(std::exp(chunk_nll[i] / chunk_n[i]));
        chunk_nll[i] = 0;
        chunk_n[i] = 0;
      }
    }
  }
  for (size_t i = 0; i < num; ++i) {
    backend->cache->Release(kv[i]);
    results[i].ppl = std::exp(nll[i] / results[i].tokens);
  }
  return results;
}

}  // namespace heavykv
