// Token masks over real vocabularies (Llama 3's and Qwen's byte-level BPE, Llama 2's
// SentencePiece with byte fallback): the trie walk with its shortcuts (looping subtrees, whole
// UTF-8 characters) must allow exactly the tokens whose bytes the grammar can continue with, as
// stepping each token's bytes one by one says. Skipped where ../shared/gguf lacks a vocabulary.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include "engine/grammar/automaton.h"
#include "engine/grammar/gbnf.h"
#include "tests/tokenizer/tokenizer_vectors.h"

namespace heavykv::grammar {
namespace {

std::string ReadSource(const std::string& rel) {
  std::ifstream in(testing::SourcePath(rel));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The masks of the states after each prefix of `text`, against the brute-force answer.
void ExpectMasksExact(const TextTokenizer& tok, const std::string& gbnf,
                      const std::vector<std::string>& prefixes) {
  absl::StatusOr<Grammar> g = CompileGbnf(gbnf);
  ASSERT_TRUE(g.ok()) << g.status();
  auto vocab = TokenVocabulary::FromTokenizer(tok);
  auto shared = std::make_shared<const Grammar>(*std::move(g));
  Automaton a(shared, vocab);
  Automaton brute(shared, vocab);  // its own memo: nothing the walk cached is reused
  for (const std::string& prefix : prefixes) {
    const int32_t s = a.StepBytes(a.Start(), prefix);
    ASSERT_NE(s, Automaton::kDead) << prefix << " " << a.status() << " states " << a.num_states() << " frames " << a.num_frames();
    std::vector<uint64_t> words(size_t(vocab->num_words()));
    a.FillMask(s, words);
    const int32_t b = brute.StepBytes(brute.Start(), prefix);
    int64_t allowed = 0, wrong = 0;
    for (int32_t t = 0; t < vocab->size(); ++t) {
      const bool got = (words[size_t(t) >> 6] >> (t & 63)) & 1;
      bool want = false;
      if (vocab->IsText(t)) {
        want = brute.StepBytes(b, vocab->bytes(t)) != Automaton::kDead;
      } else if (vocab->IsEog(t)) {
        want = brute.Accepting(b);
      }
      allowed += want;
      if (got != want && ++wrong <= 5) {
        ADD_FAILURE() << "after `" << prefix << "` token " << t << " `" << vocab->bytes(t)
                      << "`: mask " << got << ", bytes " << want;
      }
    }
    EXPECT_EQ(wrong, 0) << prefix;
    EXPECT_GT(allowed, 0) << prefix;
  }
}

const std::vector<std::string> kJsonPrefixes = {
    "",         "{",          "{\"",       "{\"a\": \"",         "{\"a\": \"h\xC3",
    "{\"a\": 1", "{\"a\": -0.", "{\"a\": [true, f",  "{\"a\": \"x\\u00",
    "{\"a\": [[[[\"deep", "{\"a\": \"\\", "{\"a\": [1, 2, 3]"};

TEST(TokenMaskTest, JsonMasksAreExactOnRealVocabularies) {
  const std::string json = ReadSource("tests/data/gbnf/json.gbnf");
  ASSERT_FALSE(json.empty());
  int tested = 0;
  for (const char* name : {"llama3-vocab.gguf", "qwen-vocab.gguf", "ggml-vocab-llama-spm.gguf"}) {
    const TextTokenizer* tok = testing::FixtureTokenizer(name);
    if (tok == nullptr) continue;
    SCOPED_TRACE(name);
    ExpectMasksExact(*tok, json, kJsonPrefixes);
    ++tested;
  }
  if (tested == 0) GTEST_SKIP() << "no vocabulary fixture in ../shared/gguf";
}

TEST(TokenMaskTest, NarrowClassesAndNonAsciiLiteralsAreExact) {
  const TextTokenizer* tok = testing::FixtureTokenizer("llama3-vocab.gguf");
  if (tok == nullptr) GTEST_SKIP() << "llama3-vocab.gguf is not in ../shared/gguf";
  // Cyrillic-only words, a CJK literal, and ASCII digits: subtrees with UTF-8 that loops on some
  // states and not on others.
  ExpectMasksExact(*tok,
                   "root ::= ([\\u0400-\\u04FF]+ \" \")* \"\\u65e5\\u672c\" [0-9]{1,3}\n",
                   {"", "\xD0\x9F", "\xD0\x9F\xD1\x80 ", "\xE6\x97\xA5", "\xE6\x97\xA5\xE6\x9C\xAC" "1"});
}

}  // namespace
}  // namespace heavykv::grammar
