// The SentencePiece Tokenizer (engine/tokenizer/tokenizer.h) on llama.cpp's test vectors for two
// "llama" GGUF vocabularies (tests/data/gguf/ggml-vocab-{llama-spm,phi-3}.gguf and their .inp /
// .out, llama.cpp's ids without BOS). llama2.c's merge loop and llama.cpp's SentencePiece tokenizer
// agree on all of them: the dummy-prefix space, byte fallback and score-ordered merges.
#include "engine/tokenizer/gguf_tokenizer.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/gguf/gguf.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tests/tokenizer/tokenizer_vectors.h"

namespace heavykv {
namespace {

void ExpectVectors(const Tokenizer& tok, const std::string& name) {
  const std::string base = testing::SourcePath("tests/data/gguf/" + name);
  const std::vector<testing::Vector> vectors = testing::ReadVectors(base + ".inp", base + ".out");
  ASSERT_EQ(vectors.size(), 46u);
  for (size_t i = 0; i < vectors.size(); ++i) {
    EXPECT_EQ(tok.Encode(vectors[i].text, /*bos=*/false, /*eos=*/false), vectors[i].ids)
        << name << " vector " << i << " '" << vectors[i].text << "'";
  }
}

TEST(GgufTokenizerTest, LlamaSpmVectors) {
  absl::StatusOr<GgufFile> f =
      GgufFile::Open(testing::SourcePath("tests/data/gguf/ggml-vocab-llama-spm.gguf"));
  ASSERT_TRUE(f.ok()) << f.status();
  absl::StatusOr<Tokenizer> tok = LoadGgufTokenizer(*f, 32000);
  ASSERT_TRUE(tok.ok()) << tok.status();
  ExpectVectors(*tok, "ggml-vocab-llama-spm.gguf");
}

// Phi-3's EOS is <|endoftext|> (32000), not id 2: the file's ids are used, and its chat turn
// markers are control tokens that end a generation.
TEST(GgufTokenizerTest, Phi3Vectors) {
  absl::StatusOr<GgufFile> f =
      GgufFile::Open(testing::SourcePath("tests/data/gguf/ggml-vocab-phi-3.gguf"));
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufMetadata* tokens = f->FindMetadata("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  absl::StatusOr<Tokenizer> tok = LoadGgufTokenizer(*f, int32_t(tokens->count));
  ASSERT_TRUE(tok.ok()) << tok.status();
  ExpectVectors(*tok, "ggml-vocab-phi-3.gguf");
  EXPECT_EQ(tok->eos_id(), 32000);
  EXPECT_TRUE(tok->IsEndOfGeneration(32000));
  EXPECT_FALSE(tok->IsEndOfGeneration(2));
}

}  // namespace
}  // namespace heavykv
