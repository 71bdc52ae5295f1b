#include "engine/serving/prompt_scoring.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/serving/sampler.h"

namespace heavykv {

PromptScorer::PromptScorer(std::span<const int32_t> prompt, int32_t top_n,
                           const TextTokenizer* tokenizer)
    : out_(std::make_shared<PromptLogprobs>()), top_n_(top_n), tokenizer_(tokenizer) {
  PromptLogprobs& p = *out_;
  p.token_ids.assign(prompt.begin(), prompt.end());
  const size_t n = prompt.size();
  p.token_bytes.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    // Decoded after the token before it, as AddLogprobs does (SentencePiece's space after BOS).
    const int32_t prev = i > 0 ? prompt[i - 1] : -1;
    p.token_bytes.push_back(tokenizer_ != nullptr ? tokenizer_->Decode(prev, prompt[i])
                                                  : std::string());
  }
  // The first token has nothing before it to be predicted from.
  p.logprobs.assign(n, std::numeric_limits<float>::quiet_NaN());
  p.ranks.assign(n, 0);
  p.top.resize(n);
}

bool PromptScorer::NeedsRows(int32_t start, int32_t count) const {
  if (out_ == nullptr || complete()) return false;
  // Row t predicts position t + 1: the chunk helps when it holds a position in
  // [scored_, n - 1).
  const int32_t last = int32_t(out_->token_ids.size()) - 1;
  return start < last && start + count > scored_;
}

void PromptScorer::Score(int32_t start, int32_t count, std::span<const float> rows,
                         int32_t vocab) {
  if (out_ == nullptr) return;
  PromptLogprobs& p = *out_;
  const int32_t last = int32_t(p.token_ids.size()) - 1;
  // Only the positions that follow on from those scored: a chunk is never scored twice, and a
  // recomputed one (after a preemption) adds nothing.
  const int32_t from = std::max(start, scored_), to = std::min(start + count, last);
  for (int32_t t = from; t < to; ++t) {
    const std::span<const float> row = rows.subspan(size_t(t - start) * vocab, size_t(vocab));
    const double lse = Sampler::LogSumExp(row);
    const int32_t next = p.token_ids[size_t(t) + 1];
    const float x = row[size_t(next)];
    p.logprobs[size_t(t) + 1] = static_cast<float>(double(x) - lse);
    // vLLM's rank: 1 + the tokens strictly more likely.
    p.ranks[size_t(t) + 1] =
        1 + int32_t(std::count_if(row.begin(), row.end(), [x](float v) { return v > x; }));
    if (top_n_ == 0) continue;
    std::vector<TokenLogprob>& top = p.top[size_t(t) + 1];
    for (int32_t id : Sampler::TopTokens(row, top_n_)) {
      top.push_back({id, static_cast<float>(double(row[size_t(id)]) - lse),
                     tokenizer_ != nullptr ? tokenizer_->Decode(p.token_ids[size_t(t)], id)
                                           : std::string()});
    }
  }
  if (to > scored_) scored_ = to;
}

}  // namespace heavykv
