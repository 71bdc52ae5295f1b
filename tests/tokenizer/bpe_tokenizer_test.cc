// BpeTokenizer and LoadGgufBpeTokenizer against llama.cpp's own tokenizer test vectors (tests/data/
// gguf/*.inp, *.out: llama.cpp's ids, no BOS), plus round trips, special tokens in text and the
// errors of malformed vocabularies. The Llama 3 and Qwen vocabularies (8 and 6 MB) are read from
// ../shared/gguf/ and their tests skip when it is absent.
#include "engine/tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/gguf/gguf.h"
#include "engine/gguf/gguf_writer.h"
#include "engine/tokenizer/gguf_tokenizer.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tests/tokenizer/byte_level.h"
#include "tests/tokenizer/tokenizer_vectors.h"

namespace heavykv {
namespace {

using Ids = std::vector<int32_t>;

::testing::AssertionResult MessageHas(const absl::Status& status, std::string_view needle) {
  if (std::string(status.message()).find(needle) != std::string::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "status " << status << " lacks \"" << needle << "\"";
}

using testing::ShowIds;

std::string DecodeAll(const BpeTokenizer& tok, const Ids& ids) {
  std::string s;
  for (int32_t id : ids) s += tok.Decode(id);
  return s;
}

using testing::FixturePath;

absl::StatusOr<BpeTokenizer> LoadBpe(const std::string& path) {
  absl::StatusOr<GgufFile> f = GgufFile::Open(path);
  if (!f.ok()) return f.status();
  const GgufMetadata* tokens = f->FindMetadata("tokenizer.ggml.tokens");
  if (tokens == nullptr) return absl::NotFoundError("no tokens");
  return LoadGgufBpeTokenizer(*f, int32_t(tokens->count));
}

// llama.cpp's vectors and the mixed text for every vocabulary:
// tests/tokenizer/text_tokenizer_test.cc.


using heavykv::testing::ByteLevel;

// A small GPT-2 style vocabulary: the 256 byte tokens, merges of a few English pieces, and
// control / user-defined tokens that overlap.
BpeTokenizer::Vocab SmallVocab(const std::string& pre = "gpt-2") {
  BpeTokenizer::Vocab v;
  v.pre = pre;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(ByteLevel(std::string(1, char(b))));
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"l", "l"},       {"h", "e"},   {"he", "ll"}, {"hell", "o"},  {" ", "w"},
      {"o", "r"},       {" w", "or"}, {"l", "d"},   {" wor", "ld"}, {" ", "h"},
      {" h", "e"},      {"e", "l"},   {"el", "l"},  {"a", "a"},     {"aa", "aa"},
      {"aaaa", "aaaa"}, {"\n", "\n"}, {" ", " "},   {"  ", "  "},   {"o", "o"}};
  for (const auto& [l, r] : merges) {
    const std::string merged = ByteLevel(l + r);
    if (std::find(v.tokens.begin(), v.tokens.end(), merged) == v.tokens.end()) {
      v.tokens.push_back(merged);
    }
    v.merges.push_back(ByteLevel(l) + " " + ByteLevel(r));
  }
  v.types.assign(v.tokens.size(), BpeTokenizer::kNormal);
  for (const auto& [text, type] :
       std::vector<std::pair<std::string, int32_t>>{{"<|end|>", BpeTokenizer::kControl},
                                                    {"<|end|><|x|>", BpeTokenizer::kControl},
                                                    {"<|x|>", BpeTokenizer::kControl},
                                                    {"<think>", BpeTokenizer::kUserDefined}}) {
    v.tokens.push_back(text);
    v.types.push_back(type);
  }
  v.bos_id = int32_t(v.tokens.size()) - 4;  // <|end|> doubles as BOS and EOS
  v.eos_id = v.bos_id;
  return v;
}

int32_t IdOf(const BpeTokenizer& tok, const std::string& piece) {
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (tok.piece(id) == piece) return id;
  }
  return -1;
}

// Textbook BPE: merge the lowest-ranked adjacent pair, leftmost first, until none has a rank.
Ids NaiveBpe(const BpeTokenizer& tok, const BpeTokenizer::Vocab& vocab, std::string_view text) {
  std::vector<PreTokenizer::Span> spans;
  tok.pre_tokenizer().Split(text, &spans);
  Ids ids;
  for (const auto& span : spans) {
    std::vector<std::string> symbols;
    for (size_t i = span.begin; i < span.end; ++i) symbols.push_back(ByteLevel(text.substr(i, 1)));
    while (true) {
      size_t best = symbols.size(), best_rank = vocab.merges.size();
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        const std::string key = symbols[i] + " " + symbols[i + 1];
        for (size_t r = 0; r < best_rank; ++r) {
          if (vocab.merges[r] == key) {
            best = i;
            best_rank = r;
            break;
          }
        }
      }
      if (best == symbols.size()) break;
      symbols[best] += symbols[best + 1];
      symbols.erase(symbols.begin() + long(best) + 1);
    }
    for (const std::string& s : symbols) ids.push_back(IdOf(tok, s));
  }
  return ids;
}

std::string RandomText(std::mt19937* rng, size_t length, bool any_bytes) {
  static const std::vector<std::string> kPieces = {
      "h",       "e",     "l",       "o",  " ",  "w",  "r",  "d",  "a",
      "\n",      "'s",    "1",       "23", "é",  "€",  "😀",  "中", "\xE2\x80\x8D",
      "<|end|>", "<|x|>", "<think>", "<|", "|>", "\t", "  ", "!"};
  std::string text;
  while (text.size() < length) {
    if (any_bytes && (*rng)() % 4 == 0) {
      text.push_back(char((*rng)() % 256));
    } else {
      text += kPieces[(*rng)() % kPieces.size()];
    }
  }
  return text;
}

TEST(BpeTokenizerTest, MergesLikeTextbookBpe) {
  const BpeTokenizer::Vocab vocab = SmallVocab();
  absl::StatusOr<BpeTokenizer> tok = BpeTokenizer::Create(vocab, "small");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->Encode("hello world", false, false),
            (Ids{IdOf(*tok, "hello"), IdOf(*tok, ByteLevel(" world"))}));
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {
    std::string text;
    const char* alphabet = "helowrd a\n";
    for (size_t n = rng() % 40; n > 0; --n) text.push_back(alphabet[rng() % 10]);
    ASSERT_EQ(tok->Encode(text, false, false), NaiveBpe(*tok, vocab, text)) << "'" << text << "'";
  }
  // A long run merges in O(n log n): 1 MiB of one letter.
  const std::string run(1 << 20, 'a');
  const Ids ids = tok->Encode(run, false, false);
  EXPECT_EQ(ids.size(), size_t(1 << 17));
  EXPECT_EQ(DecodeAll(*tok, ids), run);
}

TEST(BpeTokenizerTest, RoundTripsAnyBytes) {
  absl::StatusOr<BpeTokenizer> small = BpeTokenizer::Create(SmallVocab(), "small");
  ASSERT_TRUE(small.ok()) << small.status();
  std::vector<const BpeTokenizer*> toks = {&*small};
  absl::StatusOr<BpeTokenizer> gpt2 = LoadBpe(FixturePath("ggml-vocab-gpt-2.gguf"));
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  toks.push_back(&*gpt2);
  std::mt19937 rng(11);
  for (const BpeTokenizer* tok : toks) {
    for (int i = 0; i < 300; ++i) {
      const std::string text = RandomText(&rng, rng() % 64, /*any_bytes=*/i % 2 == 1);
      const Ids ids = tok->Encode(text, false, false);
      for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok->vocab_size());
      ASSERT_EQ(DecodeAll(*tok, ids), text);
    }
    // Edge cases: NUL, lone continuation bytes, truncated and overlong sequences, surrogates.
    for (const std::string& text :
         {std::string("a\0b", 3), std::string("\x80\x80 x"), std::string("\xE2\x82"),
          std::string("\xC0\xAF"), std::string("\xED\xA0\x80"), std::string("\xF4\x90\x80\x80"),
          std::string("\xFF\xFE"), std::string("é\xE2\x82€")}) {
      EXPECT_EQ(DecodeAll(*tok, tok->Encode(text, false, false)), text);
    }
  }
}

TEST(BpeTokenizerTest, EveryPreTokenizerSplitsIntoTiles) {
  std::mt19937 rng(3);
  for (const std::string& name : PreTokenizer::Names()) {
    absl::StatusOr<PreTokenizer> pre = PreTokenizer::Create(name);
    ASSERT_TRUE(pre.ok()) << name << ": " << pre.status();
    for (int i = 0; i < 50; ++i) {
      const std::string text = RandomText(&rng, 80, i % 2 == 1);
      std::vector<PreTokenizer::Span> spans;
      pre->Split(text, &spans);
      size_t at = 0;
      for (const auto& s : spans) {
        ASSERT_EQ(s.begin, at) << name;
        ASSERT_LT(s.begin, s.end) << name;
        at = s.end;
      }
      ASSERT_EQ(at, text.size()) << name;
    }
  }
}

// Long runs of one class of character (the worst case for backtracking patterns such as \s+$)
// finish and round-trip with every pre-tokenizer.
TEST(BpeTokenizerTest, LongRunsWithEveryPreTokenizer) {
  const size_t n = 16 << 10;
  std::vector<std::string> texts = {std::string(n, ' '),       std::string(n, '\n'),
                                    std::string(n, '7'),       std::string(n, '!'),
                                    std::string(n, ' ') + "x", "x" + std::string(n, '\t') + "x"};
  std::string mixed;
  while (mixed.size() < n) mixed += " \n\r\t\xC2\xA0";
  texts.push_back(mixed);
  for (const std::string& name : PreTokenizer::Names()) {
    absl::StatusOr<BpeTokenizer> tok = BpeTokenizer::Create(SmallVocab(name), name);
    ASSERT_TRUE(tok.ok()) << tok.status();
    for (const std::string& text : texts) {
      EXPECT_EQ(DecodeAll(*tok, tok->Encode(text, false, false)), text) << name;
    }
  }
}

TEST(BpeTokenizerTest, SpecialTokensInText) {
  absl::StatusOr<BpeTokenizer> tok = BpeTokenizer::Create(SmallVocab(), "small");
  ASSERT_TRUE(tok.ok()) << tok.status();
  const int32_t end = IdOf(*tok, "<|end|>"), end_x = IdOf(*tok, "<|end|><|x|>"),
                x = IdOf(*tok, "<|x|>"), think = IdOf(*tok, "<think>");
  const int32_t hello = IdOf(*tok, "hello");
  // Longest at a position, leftmost first; text around them is encoded on its own.
  EXPECT_EQ(tok->Encode("hello<|end|><|x|>hello", false, false), (Ids{hello, end_x, hello}));
  EXPECT_EQ(tok->Encode("<|x|><|end|>hello<think>", false, false), (Ids{x, end, hello, think}));
  EXPECT_EQ(tok->Encode("<|end|", false, false).size(), 6u);  // not a token: bytes
  // Control tokens as plain text on request; user-defined ones still match.
  const std::optional<Ids> plain = tok->Encode("<|x|><think>", false, false, {}, false);
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(plain->size(), 6u);
  EXPECT_EQ(plain->back(), think);
  EXPECT_EQ(DecodeAll(*tok, *plain), "<|x|><think>");
  EXPECT_EQ(tok->Decode(think), "<think>");
  EXPECT_EQ(tok->Decode(end, think), "<think>");
  EXPECT_EQ(tok->Encode("hello", true, true), (Ids{end, hello, end}));
  EXPECT_EQ(tok->type(end), BpeTokenizer::kControl);
  EXPECT_EQ(tok->type(hello), BpeTokenizer::kNormal);
  EXPECT_TRUE(tok->Decode(-1).empty());
  EXPECT_TRUE(tok->Decode(tok->vocab_size()).empty());
}

TEST(BpeTokenizerTest, StopsWhenAsked) {
  absl::StatusOr<BpeTokenizer> tok = BpeTokenizer::Create(SmallVocab(), "small");
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::string text;
  while (text.size() < (1 << 20)) text += "hello world ";
  int calls = 0;
  EXPECT_FALSE(tok->Encode(text, false, false, [&] { return ++calls > 3; }, true).has_value());
  EXPECT_TRUE(tok->Encode("hello", false, false, [] { return false; }, true).has_value());
}

TEST(BpeTokenizerTest, MalformedVocabulariesAreErrors) {
  auto create = [](BpeTokenizer::Vocab v) {
    return BpeTokenizer::Create(std::move(v), "bad").status();
  };
  BpeTokenizer::Vocab v = SmallVocab();
  v.merges.push_back("h zz");
  absl::Status s = create(v);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageHas(s, "'zz', which is not in the vocabulary"));
  v = SmallVocab();
  v.merges.push_back("q u");  // "qu" is not a token
  EXPECT_TRUE(MessageHas(create(v), "'qu', which is not in the vocabulary"));
  v = SmallVocab();
  v.merges.push_back("hello");
  EXPECT_TRUE(MessageHas(create(v), "not two tokens separated by a space"));
  v = SmallVocab();
  v.types.pop_back();
  EXPECT_TRUE(MessageHas(create(v), "token types"));
  v = SmallVocab();
  v.types[3] = 9;
  EXPECT_TRUE(MessageHas(create(v), "token 3 has type 9"));
  v = SmallVocab();
  v.eog_ids = {-3};
  EXPECT_TRUE(MessageHas(create(v), "end-of-generation token id -3"));
  v = SmallVocab();
  v.eos_id = int32_t(v.tokens.size());
  EXPECT_TRUE(MessageHas(create(v), "EOS token id"));
  v = SmallVocab();
  v.tokens.clear();
  v.types.clear();
  EXPECT_EQ(create(v).code(), absl::StatusCode::kInvalidArgument);
  v = SmallVocab("llama-17");
  s = create(v);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageHas(s, "unknown BPE pre-tokenizer 'llama-17'"));
  EXPECT_TRUE(
      MessageHas(PreTokenizer::FromPatterns({"(unclosed"}, "x").status(), "does not compile"));
}

// A vocabulary-only GGUF file with SmallVocab's tokenizer keys, `edit` applied to the writer.
std::string WriteVocabGguf(const testing::TempDir& dir, const std::string& pre,
                           int extra_types = 0) {
  const BpeTokenizer::Vocab v = SmallVocab();
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddString("tokenizer.ggml.model", "gpt2");
  w.AddString("tokenizer.ggml.pre", pre);
  w.AddArrayString("tokenizer.ggml.tokens", v.tokens);
  std::vector<int32_t> types = v.types;
  types.resize(types.size() + extra_types, 1);
  w.AddArrayI32("tokenizer.ggml.token_type", types);
  w.AddArrayString("tokenizer.ggml.merges", v.merges);
  w.AddU32("tokenizer.ggml.bos_token_id", uint32_t(v.bos_id));
  w.AddU32("tokenizer.ggml.eos_token_id", uint32_t(v.eos_id));
  w.AddBool("tokenizer.ggml.add_bos_token", true);
  const std::string path = dir.File("vocab-" + pre + std::to_string(extra_types) + ".gguf");
  EXPECT_TRUE(w.WriteFile(path).ok());
  return path;
}

TEST(GgufBpeTokenizerTest, LoadsAndRefuses) {
  testing::TempDir dir;
  const int32_t n = int32_t(SmallVocab().tokens.size());
  {
    absl::StatusOr<GgufFile> f = GgufFile::Open(WriteVocabGguf(dir, "qwen2"));
    ASSERT_TRUE(f.ok()) << f.status();
    absl::StatusOr<BpeTokenizer> tok = LoadGgufBpeTokenizer(*f, n);
    ASSERT_TRUE(tok.ok()) << tok.status();
    EXPECT_TRUE(tok->add_bos());
    EXPECT_FALSE(tok->add_eos());
    EXPECT_EQ(tok->pre_tokenizer().name(), "qwen2");
    EXPECT_EQ(tok->Encode("hello", true, false), (Ids{n - 4, IdOf(*tok, "hello")}));
    EXPECT_EQ(LoadGgufBpeTokenizer(*f, n + 1).status().code(), absl::StatusCode::kInvalidArgument);
    // The SentencePiece loader still refuses gpt2, the BPE loader llama.
    EXPECT_EQ(LoadGgufTokenizer(*f, n).status().code(), absl::StatusCode::kUnimplemented);
  }
  {
    absl::StatusOr<GgufFile> f = GgufFile::Open(WriteVocabGguf(dir, "no-such-pre"));
    ASSERT_TRUE(f.ok()) << f.status();
    const absl::Status s = LoadGgufBpeTokenizer(*f, n).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(MessageHas(s, "'no-such-pre'"));
  }
  {
    absl::StatusOr<GgufFile> f = GgufFile::Open(WriteVocabGguf(dir, "gpt-2", /*extra_types=*/1));
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_TRUE(MessageHas(LoadGgufBpeTokenizer(*f, n).status(), "token_type has"));
  }
  const std::string spm = FixturePath("ggml-vocab-llama-spm.gguf");
  absl::StatusOr<GgufFile> f = GgufFile::Open(spm);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(LoadGgufBpeTokenizer(*f, 32000).status().code(), absl::StatusCode::kUnimplemented);
}

// What the loader decides as llama.cpp does, from token texts and general.name rather than keys:
// FIM tokens the file calls user-defined are control tokens, the FIM pad / file separator end a
// generation (a FIM id outside the vocabulary is ignored, an EOT id is not), and in a model
// named like Phi-3 a special token takes the whitespace after it.
TEST(GgufBpeTokenizerTest, LlamaCppRulesFromTextsAndName) {
  testing::TempDir dir;
  auto write = [&](const std::string& file, const std::string& name, uint32_t fim_sep,
                   uint32_t eot) {
    BpeTokenizer::Vocab v = SmallVocab();
    for (const auto& [text, type] : std::vector<std::pair<std::string, int32_t>>{
             {"<|fim_pad|>", BpeTokenizer::kUserDefined},
             {"<|file_sep|>", BpeTokenizer::kUserDefined},
             {"<|user|>", BpeTokenizer::kControl}}) {
      v.tokens.push_back(text);
      v.types.push_back(type);
    }
    GgufWriter w;
    w.AddString("general.architecture", "llama");
    w.AddString("general.name", name);
    w.AddString("tokenizer.ggml.model", "gpt2");
    w.AddString("tokenizer.ggml.pre", "gpt-2");
    w.AddArrayString("tokenizer.ggml.tokens", v.tokens);
    w.AddArrayI32("tokenizer.ggml.token_type", v.types);
    w.AddArrayString("tokenizer.ggml.merges", v.merges);
    w.AddU32("tokenizer.ggml.fim_sep_token_id", fim_sep);
    if (eot != 0) w.AddU32("tokenizer.ggml.eot_token_id", eot);
    const std::string path = dir.File(file);
    EXPECT_TRUE(w.WriteFile(path).ok());
    return path;
  };
  auto load = [](const std::string& path) -> absl::StatusOr<BpeTokenizer> {
    absl::StatusOr<GgufFile> f = GgufFile::Open(path);
    if (!f.ok()) return f.status();
    return LoadGgufBpeTokenizer(*f, int32_t(f->FindMetadata("tokenizer.ggml.tokens")->count));
  };
  const int32_t n = int32_t(SmallVocab().tokens.size()) + 3;
  const int32_t pad = n - 3, sep = n - 2, user = n - 1;
  absl::StatusOr<BpeTokenizer> tok = load(write("phi.gguf", "Phi-3 mini", 1u << 30, 0));
  ASSERT_TRUE(tok.ok()) << tok.status();
  for (int32_t id : {pad, sep}) {
    EXPECT_TRUE(tok->IsControl(id)) << id;
    EXPECT_TRUE(tok->IsEndOfGeneration(id)) << id;
  }
  EXPECT_FALSE(tok->IsEndOfGeneration(user));
  // Control now: plain text without special parsing, one token with it.
  const Ids plain = *tok->Encode("<|fim_pad|>", false, false, {}, /*parse_special=*/false);
  EXPECT_GT(plain.size(), 1u);
  EXPECT_EQ(tok->Encode("<|fim_pad|>", false, false), (Ids{pad}));
  // Phi-3: the newline and spaces after <|user|> (and after the FIM tokens) are dropped.
  const Ids hello = tok->Encode("hello", false, false);
  Ids want = {user};
  want.insert(want.end(), hello.begin(), hello.end());
  EXPECT_EQ(tok->Encode("<|user|>\n  hello", false, false), want);

  tok = load(write("other.gguf", "Llama 3", 1u << 30, 0));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_GT(tok->Encode("<|user|>\n  hello", false, false).size(), want.size());
  // A FIM id inside the vocabulary is taken as it is, and then no text is looked for: the
  // <|file_sep|> token stays what the file says.
  tok = load(write("sep.gguf", "Llama 3", uint32_t(pad), 0));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_TRUE(tok->IsEndOfGeneration(pad));
  EXPECT_FALSE(tok->IsControl(sep));
  EXPECT_FALSE(tok->IsEndOfGeneration(sep));
  EXPECT_EQ(load(write("eot.gguf", "x", 0, 1u << 30)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Real vocabularies: chat-template control tokens are single tokens, BOS and add_bos as the GGUF
// says, and a token that ends inside a UTF-8 character decodes to its bytes.
TEST(BpeTokenizerTest, RealVocabularySpecials) {
  const std::string llama3 = FixturePath("llama3-vocab.gguf");
  if (llama3.empty()) GTEST_SKIP() << "llama3-vocab.gguf is not in ../shared/gguf/";
  absl::StatusOr<BpeTokenizer> tok = LoadBpe(llama3);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->bos_id(), 128000);
  EXPECT_TRUE(tok->add_bos());
  // EOS <|end_of_text|> and the turn end <|eot_id|> (Llama 3.0: 128008 is still reserved).
  EXPECT_EQ(tok->eog_ids(), (Ids{128001, 128009}));
  EXPECT_TRUE(tok->IsEndOfGeneration(128009));
  EXPECT_FALSE(tok->IsEndOfGeneration(128000));
  const Ids ids =
      tok->Encode("<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>", true, false);
  ASSERT_EQ(ids.size(), 7u) << ShowIds(ids);
  EXPECT_EQ(ids[0], 128000);
  EXPECT_EQ(ids[1], 128006);
  EXPECT_EQ(ids[2], 882);  // "user"
  EXPECT_EQ(ids[3], 128007);
  EXPECT_EQ(ids[4], 271);  // "\n\n"
  EXPECT_EQ(ids[6], 128009);
  // U+1F47E is one token in no vocabulary we have: its bytes split across tokens.
  const Ids alien = tok->Encode("\xF0\x9F\x91\xBE", false, false);
  EXPECT_EQ(DecodeAll(*tok, alien), "\xF0\x9F\x91\xBE");

  const std::string qwen = FixturePath("qwen-vocab.gguf");
  if (qwen.empty()) GTEST_SKIP() << "qwen-vocab.gguf is not in ../shared/gguf/";
  tok = LoadBpe(qwen);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const Ids q = tok->Encode("<|im_start|>user\nhi<|im_end|>", false, false);
  ASSERT_EQ(q.size(), 5u) << ShowIds(q);
  EXPECT_EQ(q[0], 151644);
  EXPECT_EQ(q[1], 872);
  EXPECT_EQ(q[2], 198);
  EXPECT_EQ(q[4], 151645);
  // <|endoftext|>, <|im_end|> (EOS), and llama.cpp's FIM ends: <|fim_pad|>, <|repo_name|>,
  // <|file_sep|> (its "EOG token" lines for this file).
  EXPECT_EQ(tok->eog_ids(), (Ids{151643, 151645, 151662, 151663, 151664}));
  EXPECT_EQ(DecodeAll(*tok, q), "<|im_start|>user\nhi<|im_end|>");
}

}  // namespace
}  // namespace heavykv
