// Tokenizer tests against the bundled tok512.bin. The pinned ids come from an independent Python
// re-implementation of llama2.c run.c encode() reading the same file, not from this code.
#include "engine/tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace heavykv {
namespace {

// Plain gtest only: tests/CMakeLists.txt links GTest::gtest, not gmock.
using Ids = std::vector<int32_t>;

const std::string kTokPath = std::string(HEAVYKV_SOURCE_DIR) + "/models/tok512.bin";
constexpr int32_t kVocab = 512;

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::string WriteTemp(const std::string& name, const std::string& bytes) {
  const std::string path = testing::TempDir() + "/" + name;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

::testing::AssertionResult MessageHas(const absl::Status& status, std::string_view needle) {
  // std::string, not absl::string_view: this abseil build has its own string_view type.
  if (std::string(status.message()).find(needle) != std::string::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "status " << status << " lacks \"" << needle << "\"";
}

class TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto tok = Tokenizer::Load(kTokPath, kVocab);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = new Tokenizer(*std::move(tok));
  }
  static void TearDownTestSuite() { delete tok_; }

  // Decodes as a generation loop would: each token given the one before it.
  static std::string DecodeAll(const std::vector<int32_t>& ids) {
    std::string out;
    for (size_t i = 1; i < ids.size(); ++i) out += tok_->Decode(ids[i - 1], ids[i]);
    return out;
  }

  static const Tokenizer* tok_;
};
const Tokenizer* TokenizerTest::tok_ = nullptr;

TEST_F(TokenizerTest, LoadsVocabulary) {
  EXPECT_EQ(tok_->vocab_size(), 512);
  EXPECT_EQ(tok_->piece(0), "<unk>");
  EXPECT_EQ(tok_->piece(kBosId), "\n<s>\n");
  EXPECT_EQ(tok_->piece(kEosId), "\n</s>\n");
  EXPECT_EQ(tok_->piece(3), "<0x00>");
  EXPECT_EQ(tok_->piece(258), "<0xFF>");
  EXPECT_EQ(tok_->piece(403), " Once");
  EXPECT_EQ(tok_->piece(511), "\xe2\x80\x8a");  // U+200A HAIR SPACE, a 3-byte piece
  EXPECT_FLOAT_EQ(tok_->score(260), -1.0f);
  EXPECT_FLOAT_EQ(tok_->score(511), -252.0f);
}

TEST_F(TokenizerTest, EncodeEmpty) {
  // No dummy prefix for empty text.
  EXPECT_TRUE(tok_->Encode("", false, false).empty());
  EXPECT_EQ(tok_->Encode("", true, false), (Ids{1}));
  EXPECT_EQ(tok_->Encode("", false, true), (Ids{2}));
  EXPECT_EQ(tok_->Encode("", true, true), (Ids{1, 2}));
}

TEST_F(TokenizerTest, EncodePinned) {
  EXPECT_EQ(tok_->Encode("Once upon a time", true, false), (Ids{1, 403, 407, 261, 378}));
  EXPECT_EQ(tok_->Encode("Once upon a time", false, true), (Ids{403, 407, 261, 378, 2}));
  EXPECT_EQ(tok_->Encode("Hello, world!", true, false),
            (Ids{1, 346, 306, 414, 432, 263, 304, 341, 443}));
  EXPECT_EQ(tok_->Encode("Lily and Timmy", true, true), (Ids{1, 317, 269, 405, 2}));
  // The newline is not a piece: byte fallback <0x0A> = 10 + 3. No space follows it, so "The"
  // becomes 'T' + "he" rather than " The".
  EXPECT_EQ(tok_->Encode("Tom ran.\nThe end.", true, false),
            (Ids{1, 274, 287, 352, 303, 426, 13, 434, 260, 344, 264, 426}));
}

TEST_F(TokenizerTest, EncodeUtf8) {
  // "é" (C3 A9) is a vocabulary piece (485): looked up as one code point, no byte fallback.
  EXPECT_EQ(tok_->Encode("caf\xc3\xa9", true, false), (Ids{1, 280, 412, 431, 485}));
  // U+200A is a 3-byte piece on its own, after the dummy-prefix space.
  EXPECT_EQ(tok_->Encode("\xe2\x80\x8a", true, false), (Ids{1, 410, 511}));
  // U+1F600 (F0 9F 98 80) is not a piece: four byte tokens, each byte + 3.
  EXPECT_EQ(tok_->Encode("I love \xf0\x9f\x98\x80!", true, false),
            (Ids{1, 359, 401, 360, 410, 243, 162, 155, 131, 443}));
  // run.c quirks: stray continuation bytes group with each other, and a code point is cut at 4
  // bytes, so the fifth (a stray 0x80) is a token of its own.
  EXPECT_EQ(tok_->Encode(std::string("\x80\x80") + "abc", false, false),
            (Ids{410, 131, 131, 412, 430, 429}));
  EXPECT_EQ(tok_->Encode("\xf0\x9f\x98\x80\x80z", false, false),
            (Ids{410, 243, 162, 155, 131, 131, 451}));
}

TEST_F(TokenizerTest, EncodeStopsAtNulLikeACString) {
  EXPECT_EQ(tok_->Encode(std::string_view("Lily\0 and", 9), true, false),
            tok_->Encode("Lily", true, false));
  EXPECT_EQ(tok_->Encode(std::string_view("\0abc", 4), true, false), (Ids{1}));
}

TEST_F(TokenizerTest, RoundTrip) {
  for (const std::string text :
       {"Once upon a time", "Hello, world!", "caf\xc3\xa9", "I love \xf0\x9f\x98\x80!",
        "Tom ran.\nThe end.", "  two leading spaces", "Lily and Timmy played.", "a\tb~|"}) {
    const std::vector<int32_t> ids = tok_->Encode(text, true, false);
    EXPECT_EQ(DecodeAll(ids), text) << "text: " << text;
  }
}

TEST_F(TokenizerTest, Decode) {
  EXPECT_EQ(tok_->Decode(kBosId, 403), "Once");  // leading space stripped only after BOS
  EXPECT_EQ(tok_->Decode(5, 403), " Once");
  EXPECT_EQ(tok_->Decode(kBosId, 410), "");  // the " " piece itself becomes empty after BOS
  EXPECT_EQ(tok_->Decode(kBosId, 260), "he");
  EXPECT_EQ(tok_->Decode(5, 13), "\n");     // <0x0A>
  EXPECT_EQ(tok_->Decode(5, 243), "\xf0");  // <0xF0>
  EXPECT_EQ(tok_->Decode(5, 258), "\xff");  // <0xFF>
  EXPECT_EQ(tok_->Decode(5, 3), "");        // <0x00>: run.c returns an empty C string
  EXPECT_EQ(tok_->Decode(5, kEosId), "\n</s>\n");
  EXPECT_EQ(tok_->Decode(5, 0), "<unk>");
  EXPECT_EQ(tok_->Decode(5, 512), "");  // out of range
  EXPECT_EQ(tok_->Decode(5, -1), "");
}

TEST(IsPrintablePieceTest, MatchesSafePrintf) {
  EXPECT_TRUE(Tokenizer::IsPrintablePiece("a"));
  EXPECT_TRUE(Tokenizer::IsPrintablePiece(" "));
  EXPECT_TRUE(Tokenizer::IsPrintablePiece("\n"));
  EXPECT_TRUE(Tokenizer::IsPrintablePiece("\t"));
  EXPECT_TRUE(Tokenizer::IsPrintablePiece("~"));
  EXPECT_TRUE(Tokenizer::IsPrintablePiece(""));
  EXPECT_TRUE(Tokenizer::IsPrintablePiece(" Once"));
  EXPECT_TRUE(Tokenizer::IsPrintablePiece("\xc3\xa9"));  // multi-byte pieces always print
  EXPECT_FALSE(Tokenizer::IsPrintablePiece("\x01"));
  EXPECT_FALSE(Tokenizer::IsPrintablePiece("\x7f"));
  EXPECT_FALSE(Tokenizer::IsPrintablePiece("\xf0"));  // lone UTF-8 lead byte
  EXPECT_FALSE(Tokenizer::IsPrintablePiece(std::string_view("\0", 1)));
}

// The reference for the O(n log n) merge: run.c's encode() as Tokenizer::Encode was written before
// it (a full rescan of adjacent pairs per merge, quadratic), over the tokenizer's public
// vocabulary.
Ids QuadraticEncode(const Tokenizer& tok, std::string_view text, bool bos, bool eos) {
  std::unordered_map<std::string, int32_t> ids;
  for (int32_t id = 0; id < tok.vocab_size(); ++id) ids.emplace(tok.piece(id), id);
  auto lookup = [&ids](const std::string& s) -> int32_t {
    auto it = ids.find(s);
    return it == ids.end() ? -1 : it->second;
  };
  const size_t nul = text.find('\0');
  if (nul != std::string_view::npos) text = text.substr(0, nul);
  Ids tokens;
  if (bos) tokens.push_back(kBosId);
  if (!text.empty()) {
    const int32_t space = lookup(" ");
    tokens.push_back(space != -1 ? space : ' ' + 3);
  }
  std::string code_point;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c & 0xC0) != 0x80) code_point.clear();
    code_point.push_back(static_cast<char>(c));
    const bool next_is_continuation =
        i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80;
    if (next_is_continuation && code_point.size() < 4) continue;
    const int32_t id = lookup(code_point);
    if (id != -1) {
      tokens.push_back(id);
    } else {
      for (unsigned char b : code_point) tokens.push_back(static_cast<int32_t>(b) + 3);
    }
    code_point.clear();
  }
  std::string merged;
  while (true) {
    float best_score = -1e10f;
    int32_t best_id = -1;
    size_t best_idx = 0;
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
      merged.assign(tok.piece(tokens[i]));
      merged.append(tok.piece(tokens[i + 1]));
      const int32_t id = lookup(merged);
      if (id != -1 && tok.score(id) > best_score) {
        best_score = tok.score(id);
        best_id = id;
        best_idx = i;
      }
    }
    if (best_id == -1) break;
    tokens[best_idx] = best_id;
    tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(best_idx) + 1);
  }
  if (eos) tokens.push_back(kEosId);
  return tokens;
}

// Random texts of the kinds that stress the merge order. `alphabet` holds the code points (any
// byte strings) the word-like texts are drawn from; its first two are the ones repeated in runs.
class TextGenerator {
 public:
  TextGenerator(uint32_t seed, std::vector<std::string> alphabet)
      : rng_(seed), alphabet_(std::move(alphabet)) {}

  std::string Next(int kind) {
    const int len = Uniform(0, 200);
    std::string s;
    switch (kind % 6) {
      case 0:  // ASCII words and spaces
        for (int i = 0; i < len; ++i) {
          s += Uniform(0, 5) == 0 ? ' ' : static_cast<char>('a' + Uniform(0, 25));
        }
        break;
      case 1:  // any bytes: invalid UTF-8, stray continuation bytes, NUL
        for (int i = 0; i < len; ++i) s += static_cast<char>(Uniform(0, 255));
        break;
      case 2:  // the alphabet, multi-byte code points included
        for (int i = 0; i < len; ++i) s += alphabet_[Uniform(0, alphabet_.size() - 1)];
        break;
      case 3: {  // one repeated character ("aaaa", "    "), on which every pair ties
        const std::string& unit = Uniform(0, 1) == 0 ? alphabet_[0] : alphabet_[1];
        for (int i = 0; i < len; ++i) s += unit;
        break;
      }
      case 4:  // long runs of spaces between words
        for (int i = 0; i < len / 10; ++i) {
          s += std::string(Uniform(0, 30), ' ');
          s += alphabet_[Uniform(0, alphabet_.size() - 1)];
          s += alphabet_[Uniform(0, alphabet_.size() - 1)];
        }
        break;
      default:  // a repeated piece of the alphabet, e.g. "ababab" or "éééé"
        for (const std::string unit = alphabet_[Uniform(0, alphabet_.size() - 1)] +
                                      alphabet_[Uniform(0, alphabet_.size() - 1)];
             static_cast<int>(s.size()) < len;) {
          s += unit;
        }
        break;
    }
    return s;
  }

 private:
  int Uniform(size_t lo, size_t hi) {
    return static_cast<int>(std::uniform_int_distribution<size_t>(lo, hi)(rng_));
  }
  std::mt19937 rng_;
  std::vector<std::string> alphabet_;
};

// Compares Encode with QuadraticEncode on `n` random texts of every kind, with and without BOS.
void ExpectMatchesQuadratic(const Tokenizer& tok, const std::vector<std::string>& alphabet,
                            uint32_t seed, int n) {
  TextGenerator gen(seed, alphabet);
  for (int i = 0; i < n; ++i) {
    const std::string text = gen.Next(i);
    const bool bos = i % 2 == 0;
    ASSERT_EQ(tok.Encode(text, bos, !bos), QuadraticEncode(tok, text, bos, !bos))
        << "text #" << i << " (kind " << i % 6 << "): \"" << text << "\"";
  }
}

TEST_F(TokenizerTest, MatchesQuadraticMergeOnRandomTexts) {
  const std::vector<std::string> alphabet = {" ",
                                             "a",
                                             "e",
                                             "h",
                                             "t",
                                             "n",
                                             "o",
                                             "s",
                                             " the",
                                             ".",
                                             ",",
                                             "\n",
                                             "\xc3\xa9",
                                             "\xe2\x80\x8a",
                                             "\xf0\x9f\x98\x80",
                                             "\x80"};
  ExpectMatchesQuadratic(*tok_, alphabet, 1, 600);
  // Story text, where most pairs merge in long cascades.
  const std::string story =
      "Once upon a time, there was a little girl named Lily. She liked to "
      "play outside with her dog Max.  One day   they found a big red ball!";
  for (int i = 0; i < 8; ++i) {
    const std::string text = story.substr(i * 7, 40 + i * 17);
    EXPECT_EQ(tok_->Encode(text, true, false), QuadraticEncode(*tok_, text, true, false)) << text;
  }
}

// Writes a llama2.c tokenizer file: max_token_length, then (score, length, bytes) per token.
std::string WriteTokenizer(const std::string& name,
                           const std::vector<std::pair<std::string, float>>& tokens) {
  int32_t max_len = 0;
  for (const auto& [piece, score] : tokens) {
    max_len = std::max(max_len, static_cast<int32_t>(piece.size()));
  }
  std::string bytes(reinterpret_cast<const char*>(&max_len), sizeof(max_len));
  for (const auto& [piece, score] : tokens) {
    const int32_t len = static_cast<int32_t>(piece.size());
    bytes.append(reinterpret_cast<const char*>(&score), sizeof(score));
    bytes.append(reinterpret_cast<const char*>(&len), sizeof(len));
    bytes.append(piece);
  }
  return WriteTemp(name, bytes);
}

// A hand-made vocabulary that exercises rules tok512.bin cannot: equal merge scores, a piece
// too poorly scored to ever merge, a duplicated piece, and a 4-byte code point piece.
TEST(TokenizerSyntheticTest, MergeRulesMatchRunC) {
  std::vector<std::pair<std::string, float>> tokens = {
      {"<unk>", 0.0f}, {"\n<s>\n", 0.0f}, {"\n</s>\n", 0.0f}};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    tokens.emplace_back(buf, 0.0f);
  }
  tokens.insert(tokens.end(), {{" ", -1.0f},                // 259
                               {"ab", 1.0f},                // 260
                               {"bc", 1.0f},                // 261: ties with "ab"
                               {"\xf0\x9f\x98\x80", 0.0f},  // 262: U+1F600
                               {"a", -3.0f},                // 263
                               {"b", -3.0f},                // 264
                               {"c", -3.0f},                // 265
                               {"zz", -2e10f},              // 266: below run.c's -1e10 floor
                               {"z", -3.0f},                // 267
                               {"ab", 5.0f}});              // 268: duplicate of 260
  auto tok = Tokenizer::Load(WriteTokenizer("tok_synthetic.bin", tokens), 269);
  ASSERT_TRUE(tok.ok()) << tok.status();
  // "ab" and "bc" tie: the first pair merges; the duplicate "ab" resolves to the lowest id.
  EXPECT_EQ(tok->Encode("abc", false, false), (Ids{259, 260, 265}));
  EXPECT_EQ(tok->Encode("abab", false, false), (Ids{259, 260, 260}));
  EXPECT_EQ(tok->Encode("zz", false, false), (Ids{259, 267, 267}));
  // A code point stops at 4 bytes: the emoji is found, the extra continuation byte falls back.
  EXPECT_EQ(tok->Encode("\xf0\x9f\x98\x80\x80", false, false), (Ids{259, 262, 131}));
}

// A vocabulary of random pieces whose scores come from a handful of values, so that most merge
// decisions are ties, plus pieces at and around run.c's -1e10 floor, NaN and infinite scores, a
// BOS merge, merges of byte-fallback pieces, and byte tokens whose pieces are "" or a duplicate.
std::vector<std::pair<std::string, float>> TiedVocabulary(uint32_t seed) {
  std::mt19937 rng(seed);
  auto pick = [&rng](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  std::vector<std::pair<std::string, float>> tokens = {
      {"<unk>", 0.0f}, {"\n<s>\n", 0.0f}, {"\n</s>\n", 0.0f}};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    tokens.emplace_back(buf, 0.0f);
  }
  tokens[3 + 'q'].first = "";   // merges with a neighbour into the neighbour's own piece
  tokens[3 + 'x'].first = "a";  // shadows the "a" piece below: lookup("a") finds this id
  const std::vector<std::string> chars = {" ", "a", "b", "c", "d", "\xc3\xa9"};
  const std::vector<float> tied = {-1.0f, 0.0f, 0.0f, 1.0f, 2.0f};
  for (const std::string& c : chars) tokens.emplace_back(c, tied[pick(tied.size())]);
  for (const std::string& a : chars) {
    for (const std::string& b : chars) tokens.emplace_back(a + b, tied[pick(tied.size())]);
  }
  for (int i = 0; i < 120; ++i) {
    std::string piece;
    for (size_t len = 3 + pick(4); piece.size() < len;) piece += chars[pick(chars.size())];
    tokens.emplace_back(piece, tied[pick(tied.size())]);
  }
  tokens.insert(tokens.end(), {{"aaaa", 1.0f},
                               {"    ", 1.0f},
                               {"\n<s>\n ", 2.0f},      // BOS + dummy prefix
                               {"<0xE2><0x80>", 1.0f},  // two byte-fallback pieces
                               {"<0xE2><0x80><0x8A>", 2.0f},
                               {"ab" + chars[5], -1e10f},   // at the floor: never
                               {"ba" + chars[5], -9.9e9f},  // just above it: merges
                               {"cab", std::numeric_limits<float>::quiet_NaN()},  // never
                               {"dab", -std::numeric_limits<float>::infinity()},  // never
                               {"bad", std::numeric_limits<float>::infinity()},
                               {"dd", 7.0f}});  // duplicate, higher score
  return tokens;
}

TEST(TokenizerSyntheticTest, MatchesQuadraticMergeWithTiedScores) {
  const std::vector<std::string> alphabet = {
      "a", " ", "b", "c", "d", "\xc3\xa9", "q", "x", "ab", "\xe2\x80\x8a", "\x80", "e"};
  for (uint32_t seed : {1u, 2u, 3u}) {
    const std::vector<std::pair<std::string, float>> tokens = TiedVocabulary(seed);
    auto tok = Tokenizer::Load(WriteTokenizer("tok_tied.bin", tokens),
                               static_cast<int32_t>(tokens.size()));
    ASSERT_TRUE(tok.ok()) << tok.status();
    ExpectMatchesQuadratic(*tok, alphabet, seed, 600);
  }
}

// About n bytes of tests/data/eval_stories.txt, repeated as needed.
std::string StoryText(size_t n) {
  const std::string stories =
      ReadAll(std::string(HEAVYKV_SOURCE_DIR) + "/tests/data/eval_stories.txt");
  std::string text;
  text.reserve(n);
  while (text.size() < n) text.append(stories, 0, std::min(stories.size(), n - text.size()));
  return text;
}

TEST_F(TokenizerTest, ShouldStopEndsTheEncodeAtEveryCheck) {
  const std::string text = StoryText(64 << 10);
  const Ids expected = tok_->Encode(text, true, false);
  int calls = 0;
  const std::optional<Ids> full = tok_->Encode(text, true, false, [&calls] { return ++calls < 0; }, true);
  ASSERT_TRUE(full.has_value());
  EXPECT_EQ(*full, expected);
  // Both the code-point split and the merge loop poll: more than one check per 4096 bytes.
  EXPECT_GT(calls, static_cast<int>(text.size() / 4096));
  // Stopping at any one of those checks, early (split) or late (merges), gives nothing.
  for (int stop_at = 1; stop_at <= calls; ++stop_at) {
    int n = 0;
    EXPECT_FALSE(tok_->Encode(text, true, false, [&] { return ++n == stop_at; }, true).has_value())
        << "stop at check " << stop_at << " of " << calls;
    EXPECT_EQ(n, stop_at);
  }
  // An empty check never stops.
  EXPECT_EQ(tok_->Encode(text, false, true, std::function<bool()>(), true),
            tok_->Encode(text, false, true));
}

TEST_F(TokenizerTest, EncodesAMegabyte) {
  const std::string text = StoryText(1 << 20);
  const Ids ids = tok_->Encode(text, true, true);
  ASSERT_GT(ids.size(), 2u);
  EXPECT_EQ(ids.front(), kBosId);
  EXPECT_EQ(ids.back(), kEosId);
  // Story text merges to well under a token per byte, and decodes back to itself.
  EXPECT_LT(ids.size(), text.size() / 2);
  EXPECT_EQ(DecodeAll(Ids(ids.begin(), ids.end() - 1)), text);
}

TEST(TokenizerLoadTest, MissingFile) {
  const std::string path = testing::TempDir() + "/no_such_tokenizer.bin";
  auto tok = Tokenizer::Load(path, kVocab);
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(MessageHas(tok.status(), path));
}

TEST(TokenizerLoadTest, Truncated) {
  const std::string bytes = ReadAll(kTokPath);
  ASSERT_EQ(bytes.size(), 6227u);
  // Cut inside the header, inside a token's header and inside a token's bytes.
  for (size_t len : {size_t{0}, size_t{2}, size_t{6}, bytes.size() / 2, bytes.size() - 1}) {
    const std::string path = WriteTemp("tok_truncated.bin", bytes.substr(0, len));
    auto tok = Tokenizer::Load(path, kVocab);
    ASSERT_FALSE(tok.ok()) << "length " << len;
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(MessageHas(tok.status(), "truncated"));
    EXPECT_TRUE(MessageHas(tok.status(), path));
  }
}

TEST(TokenizerLoadTest, WrongVocabSize) {
  auto small = Tokenizer::Load(kTokPath, 511);
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageHas(small.status(), "expected 511 tokens, file has at least 512"));
  EXPECT_TRUE(MessageHas(small.status(), kTokPath));

  auto large = Tokenizer::Load(kTokPath, 1024);
  ASSERT_FALSE(large.ok());
  EXPECT_EQ(large.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageHas(large.status(), "expected 1024 tokens, file has 512"));

  auto tiny = Tokenizer::Load(kTokPath, 100);  // cannot hold the 256 byte tokens
  ASSERT_FALSE(tiny.ok());
  EXPECT_EQ(tiny.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageHas(tiny.status(), "vocab_size 100"));
}

TEST(TokenizerLoadTest, BadTokenLength) {
  std::string bytes = ReadAll(kTokPath);
  // Token 0 ("<unk>") length field lives at bytes 8..11; make it negative, then too long.
  for (int32_t len : {-1, 8}) {
    std::memcpy(bytes.data() + 8, &len, sizeof(len));
    auto tok = Tokenizer::Load(WriteTemp("tok_badlen.bin", bytes), kVocab);
    ASSERT_FALSE(tok.ok());
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(MessageHas(tok.status(), "token 0 has invalid length"));
  }
}

}  // namespace
}  // namespace heavykv
