// BpeTokenizer and LoadGgufBpeTokenizer against llama.cpp's own tokenizer test vectors (tests/data/
// gguf/*.inp, *.out: llama.cpp's ids, no BOS), plus round trips, special tokens in text and the
// errors of malformed vocabularies. The Llama 3 and Qwen vocabularies (8 and 6 MB) are read from
// ../shared/gguf/ and their tests skip when it is absent.
#include "engine/bpe_tokenizer.h"

#include <cstdint>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/gguf.h"
#include "engine/gguf_tokenizer.h"
#include "engine/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace heavykv {
namespace {

using Ids = std::vector<int32_t>;

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

bool Exists(const std::string& path) { return std::ifstream(path).good(); }

::testing::AssertionResult MessageHas(const absl::Status& status, std::string_view needle) {
  if (std::string(status.message()).find(needle) != std::string::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "status " << status << " lacks \"" << needle << "\"";
}

struct Vector {
  std::string text;
  Ids ids;
};

// llama.cpp's tests/test-tokenizer-0 format: inputs separated by "\n__ggml_vocab_test__\n", one
// line of space-separated ids per input.
std::vector<Vector> ReadVectors(const std::string& inp_path, const std::string& out_path) {
  const std::string inp = ReadAll(inp_path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t pos = 0; pos < inp.size();) {
    const size_t next = inp.find(sep, pos);
    if (next == std::string::npos) {
      texts.push_back(inp.substr(pos));
      break;
    }
    texts.push_back(inp.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::ifstream out(out_path);
  std::vector<Vector> vectors;
  std::string line;
  for (size_t i = 0; std::getline(out, line); ++i) {
    Vector v;
    if (i < texts.size()) v.text = texts[i];
    std::istringstream ids(line);
    for (int32_t id; ids >> id;) v.ids.push_back(id);
    vectors.push_back(std::move(v));
  }
  EXPECT_EQ(vectors.size(), texts.size()) << inp_path;
  return vectors;
}

std::string Show(const Ids& ids) {
  std::string s;
  for (int32_t id : ids) s += " " + std::to_string(id);
  return s;
}

std::string DecodeAll(const BpeTokenizer& tok, const Ids& ids) {
  std::string s;
  for (int32_t id : ids) s += tok.Decode(id);
  return s;
}

// The GGUF fixture `name`: tests/data/gguf/ first, then ../shared/gguf/; "" when neither has it.
std::string FixturePath(const std::string& name) {
  for (const char* dir : {"tests/data/gguf/", "../shared/gguf/"}) {
    const std::string path = testing::SourcePath(dir + name);
    if (Exists(path)) return path;
  }
  return "";
}

absl::StatusOr<BpeTokenizer> LoadBpe(const std::string& path) {
  absl::StatusOr<GgufFile> f = GgufFile::Open(path);
  if (!f.ok()) return f.status();
  const GgufMetadata* tokens = f->FindMetadata("tokenizer.ggml.tokens");
  if (tokens == nullptr) return absl::NotFoundError("no tokens");
  return LoadGgufBpeTokenizer(*f, int32_t(tokens->count));
}

class VectorTest : public ::testing::TestWithParam<const char*> {};

TEST_P(VectorTest, MatchesLlamaCpp) {
  const std::string name = GetParam();
  const std::string path = FixturePath(name);
  if (path.empty()) GTEST_SKIP() << name << " is not in tests/data/gguf/ or ../shared/gguf/";
  absl::StatusOr<BpeTokenizer> tok = LoadBpe(path);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::vector<Vector> vectors = ReadVectors(testing::SourcePath("tests/data/gguf/" + name + ".inp"),
                                                  testing::SourcePath("tests/data/gguf/" + name + ".out"));
  ASSERT_FALSE(vectors.empty());
  int failed = 0;
  for (size_t i = 0; i < vectors.size(); ++i) {
    const Ids got = tok->Encode(vectors[i].text, /*bos=*/false, /*eos=*/false);
    if (got != vectors[i].ids) {
      ++failed;
      ADD_FAILURE() << name << " vector " << i << " '" << vectors[i].text << "'\n  want"
                    << Show(vectors[i].ids) << "\n  got " << Show(got);
    }
    EXPECT_EQ(DecodeAll(*tok, got), vectors[i].text) << name << " vector " << i;
  }
  EXPECT_EQ(failed, 0) << "of " << vectors.size();
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, VectorTest,
                         ::testing::Values("llama3-vocab.gguf", "qwen-vocab.gguf",
                                           "ggml-vocab-gpt-2.gguf",
                                           "ggml-vocab-deepseek-coder.gguf"),
                         [](const auto& info) {
                           std::string n = info.param;
                           n = n.substr(0, n.find(".gguf"));
                           for (char& c : n) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace heavykv
