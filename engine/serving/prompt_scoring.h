// PromptScorer: one request's prompt log-probabilities (GenerationRequest::prompt_logprobs),
// built chunk by chunk from the rows of its prompt chunks, which the engine runs with
// SequenceStep::all_logits (docs/ARCHITECTURE.md "Prompt logprobs and echo").
//
//   PromptScorer scorer(prompt, top_n, tokenizer);
//   step.all_logits = scorer.NeedsRows(chunk.start, chunk.count);
//   ...Forward...
//   scorer.Score(chunk.start, chunk.count, rows);   // rows [count][vocab]
//   if (scorer.complete()) delta.prompt = scorer.Take();
//
// Row t of a chunk starting at `start` gives token start + t + 1: its log-probability is
// logits[t][token] - LogSumExp(logits[t]) in double, as Evaluate computes it, so the figures equal
// `heavykv eval`'s for the same tokens and cache. Positions already scored are skipped, so a
// sequence preempted and recomputed from its first token records each position once.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/serving/engine.h"
#include "engine/tokenizer/text_tokenizer.h"

namespace heavykv {

class PromptScorer {
 public:
  // `prompt` [n] the prompt's token ids (copied); `top_n` the most likely tokens kept per
  // position (0: none); `tokenizer` may be null (no token bytes).
  PromptScorer(std::span<const int32_t> prompt, int32_t top_n, const TextTokenizer* tokenizer);

  // Whether the chunk of positions [start, start + count) has a position still to score: it must
  // then run with all_logits.
  bool NeedsRows(int32_t start, int32_t count) const;
  // Scores the chunk's positions not scored yet. `rows` [count][vocab]: one row per position.
  void Score(int32_t start, int32_t count, std::span<const float> rows, int32_t vocab);
  // Every position with a next prompt token is scored (at once for a one-token prompt).
  bool complete() const { return scored_ + 1 >= int32_t(out_->token_ids.size()); }
  // The result, once complete(); the scorer is empty after it.
  std::shared_ptr<const PromptLogprobs> Take() { return std::move(out_); }

 private:
  std::shared_ptr<PromptLogprobs> out_;
  int32_t top_n_ = 0;
  const TextTokenizer* tokenizer_ = nullptr;
  int32_t scored_ = 0;  // positions [0, scored_) have their next token's entry
};

}  // namespace heavykv
