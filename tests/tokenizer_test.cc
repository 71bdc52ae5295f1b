// Tokenizer tests against the bundled tok512.bin. The pinned ids come from an independent Python
// re-implementation of llama2.c run.c encode() reading the same file, not from this code.
#include "engine/tokenizer.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
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
