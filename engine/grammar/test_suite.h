// JSON-Schema-Test-Suite groups walked token by token through the masks: what `heavykv grammar
// test` and the grammar benchmarks run (docs/ARCHITECTURE.md "Structured outputs").
//
//   GroupResult g = RunSchemaGroup(compiler, tokenizer, group_json);
//
// A group is {"schema": ..., "tests": [{"data": ..., "valid": bool}, ...]}. Each instance is
// written as json.dumps(data, ensure_ascii=False) writes it (json_text.h), tokenized without
// BOS and special tokens (SentencePiece's leading space left out: TokensOfExactly), and walked
// through a fresh ConstraintMatcher: a valid instance passes
// when every token and then an end-of-generation token are allowed, an invalid one when some
// token or the end is refused. Masks are timed one by one (the automaton is the compiled
// group's, so a group's later instances meet its states again, as later requests would).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/grammar/constraint.h"
#include "engine/tokenizer/text_tokenizer.h"
#include "nlohmann/json.hpp"

namespace heavykv::grammar {

struct GroupResult {
  bool compiled = false;
  std::string error;       // why it did not compile
  double compile_us = 0;   // Compile, the vocabulary already built
  int64_t tests = 0, passed = 0, valid_rejected = 0, invalid_accepted = 0, tokens = 0;
  std::vector<double> mask_us;  // every FillMask of the group
};

GroupResult RunSchemaGroup(ConstraintCompiler& compiler, const TextTokenizer& tokenizer,
                           const nlohmann::ordered_json& group);

// The tokenizer's tokens of `text` (no BOS, special tokens as text) when their bytes are exactly
// `text`; else (SentencePiece's leading space) the longest token at each byte.
std::vector<int32_t> TokensOfExactly(const TextTokenizer& tokenizer, const TokenVocabulary& vocab,
                                     std::string_view text);

// Whether each token of `ids` and then the end are allowed, walking a fresh matcher of `c`;
// each FillMask's time in microseconds is appended to `mask_us`.
bool WalkTokens(const std::shared_ptr<const CompiledConstraint>& c,
                const std::vector<int32_t>& ids, std::vector<double>& mask_us,
                int32_t* tokens_walked = nullptr);

// The q-quantile (0..1) of `v` (sorted here), 0 when empty.
double Quantile(std::vector<double> v, double q);

}  // namespace heavykv::grammar
