// The TextTokenizer interface (engine/tokenizer/text_tokenizer.h) over the six GGUF vocabularies we
// have, each loaded by LoadGgufTextTokenizer as run and serve load them: byte-level BPE (gpt-2,
// deepseek-coder, llama3-vocab, qwen-vocab) and SentencePiece (llama-spm, phi-3).
//   - llama.cpp's own test vectors (tests/data/gguf/*.inp, *.out; ids without BOS);
//   - round trips of seeded random text (ASCII, multi-byte UTF-8, emoji, whitespace runs);
//   - special tokens written in chat-style text, with and without BOS and special-token parsing,
//     against llama.cpp's llama-tokenize (tests/data/gguf/special.jsonl, written by
//     make_special_vectors.sh);
//   - BOS / add_bos and the end-of-generation sets the files imply.
// llama3-vocab.gguf and qwen-vocab.gguf are read from ../shared/gguf/; their cases skip without it.
#include "engine/tokenizer/text_tokenizer.h"

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/gguf/gguf.h"
#include "engine/tokenizer/gguf_tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"
#include "tests/tokenizer/tokenizer_vectors.h"

namespace heavykv {
namespace {

using Ids = std::vector<int32_t>;

struct VocabCase {
  const char* name;
  bool sentencepiece;
};

constexpr VocabCase kVocabs[] = {
    {"ggml-vocab-gpt-2.gguf", false},    {"ggml-vocab-deepseek-coder.gguf", false},
    {"llama3-vocab.gguf", false},        {"qwen-vocab.gguf", false},
    {"ggml-vocab-llama-spm.gguf", true}, {"ggml-vocab-phi-3.gguf", true},
};

using testing::FixtureTokenizer;

using testing::ShowIds;

// Decode over `ids`, each token after the one before it (the first after none).
std::string DecodeAll(const TextTokenizer& tok, const Ids& ids, int32_t prev = -1) {
  std::string s;
  for (int32_t id : ids) {
    s += tok.Decode(prev, id);
    prev = id;
  }
  return s;
}

// Random text from pieces that exercise the pre-tokenizers and byte fallback: ASCII words and
// punctuation, digits, runs of spaces, tabs and newlines, accented Latin, CJK, Cyrillic, emoji
// (4-byte, with a skin tone and a ZWJ sequence), a combining mark, no-break and ideographic
// spaces. No '<', so no special token can appear.
std::string RandomText(std::mt19937* rng) {
  static const std::vector<std::string> kParts = {"a",
                                                  "the",
                                                  "Hello",
                                                  "world",
                                                  "I'm",
                                                  "don't",
                                                  "x",
                                                  "Z",
                                                  "42",
                                                  "2025",
                                                  "3.14",
                                                  ",",
                                                  ".",
                                                  "!",
                                                  "?",
                                                  "(",
                                                  ")",
                                                  "-",
                                                  "_",
                                                  "'",
                                                  "\"",
                                                  "/",
                                                  "#",
                                                  " ",
                                                  "  ",
                                                  "   ",
                                                  "\t",
                                                  "\n",
                                                  "\n\n",
                                                  " \n",
                                                  "\r\n",
                                                  "é",
                                                  "ü",
                                                  "ß",
                                                  "ñ",
                                                  "中",
                                                  "文",
                                                  "字",
                                                  "Ж",
                                                  "щ",
                                                  "☃",
                                                  "€",
                                                  "😀",
                                                  "👾",
                                                  "👍🏽",
                                                  "👨‍👩‍👧",
                                                  "e\xCC\x81",
                                                  "\xC2\xA0",
                                                  "\xE3\x80\x80",
                                                  "ｶ",
                                                  "한",
                                                  "ا",
                                                  "🇺🇸"};
  std::uniform_int_distribution<size_t> part(0, kParts.size() - 1);
  std::uniform_int_distribution<int> length(0, 40);
  std::string s;
  for (int n = length(*rng); n > 0; --n) s += kParts[part(*rng)];
  return s;
}

class TextTokenizerVocabTest : public ::testing::TestWithParam<VocabCase> {};

TEST_P(TextTokenizerVocabTest, LlamaCppVectorsWithoutBos) {
  const std::string name = GetParam().name;
  const TextTokenizer* tok = FixtureTokenizer(name);
  if (tok == nullptr) GTEST_SKIP() << name << " is not in tests/data/gguf/ or ../shared/gguf/";
  EXPECT_EQ(tok->Describe().rfind(GetParam().sentencepiece ? "sentencepiece" : "byte-level BPE", 0),
            0u)
      << tok->Describe();
  const std::string base = testing::SourcePath("tests/data/gguf/" + name);
  const std::vector<testing::Vector> vectors = testing::ReadVectors(base + ".inp", base + ".out");
  ASSERT_FALSE(vectors.empty());
  for (size_t i = 0; i < vectors.size(); ++i) {
    const Ids got = tok->Encode(vectors[i].text, /*bos=*/false, /*eos=*/false);
    EXPECT_EQ(got, vectors[i].ids)
        << name << " vector " << i << " '" << vectors[i].text << "'\n  want" << ShowIds(vectors[i].ids)
        << "\n  got " << ShowIds(got);
  }
}

// 16 KB of mixed text (stories, scripts, code, emoji, odd spaces; tests/data/gguf/bpe-mix.txt)
// and the ids llama.cpp's llama-tokenize --no-bos --no-escape gives it (README.md there).
TEST_P(TextTokenizerVocabTest, MixedTextMatchesLlamaCpp) {
  const std::string name = GetParam().name;
  const TextTokenizer* tok = FixtureTokenizer(name);
  if (tok == nullptr) GTEST_SKIP() << name << " is not in tests/data/gguf/ or ../shared/gguf/";
  const std::string stem = name.substr(0, name.find(".gguf"));
  std::string listed =
      testing::ReadFile(testing::SourcePath("tests/data/gguf/bpe-mix." + stem + ".ids"));
  ASSERT_FALSE(listed.empty());
  for (char& c : listed) {
    if (c == '[' || c == ']' || c == ',') c = ' ';
  }
  Ids want;
  std::istringstream in(listed);
  for (int32_t id; in >> id;) want.push_back(id);
  const std::string mix = testing::ReadFile(testing::SourcePath("tests/data/gguf/bpe-mix.txt"));
  const Ids got = tok->Encode(mix, /*bos=*/false, /*eos=*/false);
  size_t first_diff = 0;
  while (first_diff < got.size() && first_diff < want.size() &&
         got[first_diff] == want[first_diff]) {
    ++first_diff;
  }
  EXPECT_EQ(got.size(), want.size());
  EXPECT_EQ(first_diff, want.size()) << "first difference at id " << first_diff;
}

// Decoding gives the text back: exactly for byte-level BPE; for SentencePiece after removing the
// dummy-prefix space the encoder put in front.
TEST_P(TextTokenizerVocabTest, RandomTextRoundTrips) {
  const std::string name = GetParam().name;
  const TextTokenizer* tok = FixtureTokenizer(name);
  if (tok == nullptr) GTEST_SKIP() << name << " is not in tests/data/gguf/ or ../shared/gguf/";
  std::mt19937 rng(20261204);
  for (int i = 0; i < 300; ++i) {
    const std::string text = RandomText(&rng);
    const Ids ids = tok->Encode(text, /*bos=*/false, /*eos=*/false);
    std::string back = DecodeAll(*tok, ids);
    if (GetParam().sentencepiece && !text.empty()) {
      ASSERT_FALSE(back.empty()) << name << " '" << text << "'";
      EXPECT_EQ(back[0], ' ') << name << " '" << text << "'";
      back.erase(0, 1);
    }
    EXPECT_EQ(back, text) << name << " case " << i << ":" << ShowIds(ids);
    // After BOS the decoder drops the dummy prefix itself.
    if (tok->bos_id() >= 0) {
      const Ids with_bos = tok->Encode(text, /*bos=*/true, /*eos=*/false);
      ASSERT_FALSE(with_bos.empty());
      EXPECT_EQ(with_bos[0], tok->bos_id());
      EXPECT_EQ(DecodeAll(*tok, Ids(with_bos.begin() + 1, with_bos.end()), tok->bos_id()), text)
          << name << " case " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, TextTokenizerVocabTest, ::testing::ValuesIn(kVocabs),
                         [](const ::testing::TestParamInfo<VocabCase>& info) {
                           std::string n = info.param.name;
                           n = n.substr(0, n.find(".gguf"));
                           for (char& c : n) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return n;
                         });

// Special tokens in chat-style text, four ways each, against llama-tokenize: BOS as the file says
// (llama-tokenize's add_special: BOS and, if the file asks, EOS) or --no-bos, and
// --no-parse-special (control tokens are text; user-defined ones still match).
TEST(TextTokenizerTest, SpecialTokensMatchLlamaCpp) {
  std::ifstream in(testing::SourcePath("tests/data/gguf/special.jsonl"));
  ASSERT_TRUE(in.good());
  int checked = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line);
    const std::string vocab = j.at("vocab");
    const TextTokenizer* tok = FixtureTokenizer(vocab);
    if (tok == nullptr) {
      std::printf("[ note ] %s is absent: its special-token vectors are not checked\n",
                  vocab.c_str());
      continue;
    }
    const std::string text = j.at("text");
    const bool bos = j.at("bos"), parse_special = j.at("parse_special");
    const Ids want = j.at("ids").get<Ids>();
    const Ids got = *tok->Encode(text, bos && tok->add_bos(), bos && tok->add_eos(),
                                 std::function<bool()>(), parse_special);
    EXPECT_EQ(got, want) << vocab << " bos=" << bos << " parse_special=" << parse_special << " '"
                         << text << "'\n  want" << ShowIds(want) << "\n  got " << ShowIds(got);
    ++checked;
  }
  EXPECT_GE(checked, 8);  // at least the vectors of the bundled SentencePiece vocabularies
}

struct EogCase {
  const char* vocab;
  int32_t bos;  // bos_id()
  bool add_bos;
  Ids eog;      // must end a generation
  Ids not_eog;  // must not
};

TEST(TextTokenizerTest, EndOfGenerationAndBos) {
  const EogCase cases[] = {
      // <|end_of_text|> (EOS), <|eot_id|>; not <|begin_of_text|>, <|start_header_id|>.
      {"llama3-vocab.gguf", 128000, true, {128001, 128009}, {128000, 128006, 128007, 882}},
      // <|endoftext|>, <|im_end|> (EOS), and as llama.cpp the FIM pad / repo / file separators
      // <|fim_pad|>, <|repo_name|>, <|file_sep|>; not <|im_start|>, <|fim_prefix|>. The file has
      // no BOS id and sets add_bos_token false.
      {"qwen-vocab.gguf",
       -1,
       false,
       {151643, 151645, 151662, 151663, 151664},
       {151644, 151659, 872}},
      // <|endoftext|> (EOS 32000), <|end|> (32007); not </s> (2), <s>, <|user|>, <|assistant|>.
      {"ggml-vocab-phi-3.gguf", 1, true, {32000, 32007}, {1, 2, 32001, 32010}},
      // </s>; not <s>.
      {"ggml-vocab-llama-spm.gguf", 1, true, {2}, {0, 1, 13}},
  };
  for (const EogCase& c : cases) {
    const TextTokenizer* tok = FixtureTokenizer(c.vocab);
    if (tok == nullptr) continue;
    EXPECT_EQ(tok->bos_id(), c.bos) << c.vocab;
    EXPECT_EQ(tok->add_bos(), c.add_bos) << c.vocab;
    EXPECT_FALSE(tok->add_eos()) << c.vocab;
    for (int32_t id : c.eog) EXPECT_TRUE(tok->IsEndOfGeneration(id)) << c.vocab << " " << id;
    for (int32_t id : c.not_eog) EXPECT_FALSE(tok->IsEndOfGeneration(id)) << c.vocab << " " << id;
    for (int32_t id : c.eog) EXPECT_TRUE(tok->IsControl(id)) << c.vocab << " " << id;
  }
}

}  // namespace
}  // namespace heavykv
