// Constraints at serving time (docs/ARCHITECTURE.md "Structured outputs"): a ConstraintSpec
// (constraint_spec.h) compiled once against the model's vocabulary, cached, and matched per
// sequence.
//
//   ConstraintCompiler compiler(TokenVocabulary::FromTokenizer(*tokenizer));  // one per engine
//   absl::StatusOr<std::shared_ptr<const CompiledConstraint>> c = compiler.Compile(spec);
//   ConstraintMatcher m(*c);                          // one per sequence
//   if (m.active()) m.FillMask(words);                // before sampling: allowed tokens
//   absl::Status s = m.Accept(token);                 // after sampling
//   if (m.Complete()) ...                             // nothing may follow: the output is done
//
// Compile runs on the caller's thread (the fronts' handlers, never the engine's), bounded by
// GrammarLimits; its errors are INVALID_ARGUMENT (what to change, with the JSON pointer of a
// schema keyword) or RESOURCE_EXHAUSTED (a limit). Compiled constraints are kept by
// (spec, vocabulary) in an LRU of `max_entries`, and their automata (with their cached masks)
// are shared by every request that uses them.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "engine/grammar/automaton.h"
#include "engine/grammar/constraint_spec.h"
#include "engine/grammar/grammar.h"

namespace heavykv::grammar {

// The grammar of a spec, without a vocabulary (tests, `heavykv grammar`).
absl::StatusOr<Grammar> CompileGrammar(const ConstraintSpec& spec,
                                       const GrammarLimits& limits = {});

struct CompiledConstraint {
  ConstraintSpec spec;
  std::shared_ptr<Automaton> automaton;
  double compile_seconds = 0;
};

class ConstraintCompiler {
 public:
  explicit ConstraintCompiler(std::shared_ptr<const TokenVocabulary> vocab,
                              size_t max_entries = 32, GrammarLimits limits = {});
  absl::StatusOr<std::shared_ptr<const CompiledConstraint>> Compile(const ConstraintSpec& spec);
  const TokenVocabulary& vocab() const { return *vocab_; }
  std::shared_ptr<const TokenVocabulary> shared_vocab() const { return vocab_; }

 private:
  std::shared_ptr<const TokenVocabulary> vocab_;
  size_t max_entries_;
  GrammarLimits limits_;
  std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<const CompiledConstraint>>> lru_;
  std::unordered_map<std::string, decltype(lru_)::iterator> index_;
};

// One sequence's place in its constraint. Not thread-safe (the engine thread owns it).
class ConstraintMatcher {
 public:
  explicit ConstraintMatcher(std::shared_ptr<const CompiledConstraint> constraint);

  // Whether this step is constrained (a lazy constraint is not until its trigger appears).
  bool active() const { return active_; }
  // words [vocab.num_words()]: the tokens that may come next. All zero: nothing fits (the
  // automaton hit a limit or the grammar is broken): the caller ends the sequence with error().
  void FillMask(std::span<uint64_t> words);
  // Advances by the token that was sampled. FAILED_PRECONDITION when it does not fit.
  absl::Status Accept(int32_t token);
  // The grammar has matched a whole output and nothing more may follow.
  bool Complete() const { return complete_; }
  // Why the last FillMask allowed nothing.
  absl::Status error() const;

 private:
  void Activate(std::string_view tail);

  std::shared_ptr<const CompiledConstraint> c_;
  Automaton* a_;
  bool active_ = false;
  bool complete_ = false;
  int32_t state_ = Automaton::kDead;
  std::string pending_;  // a lazy constraint's output so far (its last bytes)
  size_t max_trigger_ = 0;
};

}  // namespace heavykv::grammar
