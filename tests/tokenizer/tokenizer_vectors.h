// llama.cpp's tokenizer test vectors (tests/test-tokenizer-0 format), as tests/data/gguf/*.inp and
// *.out hold them: inputs separated by lines "__ggml_vocab_test__", one line of space-separated
// ids per input (llama.cpp's ids without BOS).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "engine/gguf/gguf.h"
#include "engine/tokenizer/gguf_tokenizer.h"
#include "engine/tokenizer/text_tokenizer.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace heavykv::testing {

struct Vector {
  std::string text;
  std::vector<int32_t> ids;
};

// llama.cpp's tests/test-tokenizer-0 format: inputs separated by "\n__ggml_vocab_test__\n", one
// line of space-separated ids per input.
inline std::vector<Vector> ReadVectors(const std::string& inp_path, const std::string& out_path) {
  std::ifstream in(inp_path, std::ios::binary);
  const std::string inp((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
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

// The GGUF fixture `name`: tests/data/gguf/ first, then ../shared/gguf/ (the large vocabularies,
// llama3-vocab.gguf and qwen-vocab.gguf); "" when neither has it.
inline std::string FixturePath(const std::string& name) {
  for (const char* dir : {"tests/data/gguf/", "../shared/gguf/"}) {
    const std::string path = SourcePath(dir + name);
    if (std::filesystem::exists(path)) return path;
  }
  return "";
}

// The tokenizer of GGUF fixture `name` through the TextTokenizer interface, loaded once per test
// binary; null when the fixture is absent (a failed load fails the test).
inline const TextTokenizer* FixtureTokenizer(const std::string& name) {
  static auto* loaded = new std::map<std::string, std::unique_ptr<TextTokenizer>>();
  if (auto it = loaded->find(name); it != loaded->end()) return it->second.get();
  const std::string path = FixturePath(name);
  if (path.empty()) return nullptr;
  absl::StatusOr<GgufFile> f = GgufFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return nullptr;
  const GgufMetadata* tokens = f->FindMetadata("tokenizer.ggml.tokens");
  EXPECT_NE(tokens, nullptr) << path;
  if (tokens == nullptr) return nullptr;
  absl::StatusOr<std::unique_ptr<TextTokenizer>> t =
      LoadGgufTextTokenizer(*f, int32_t(tokens->count));
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return nullptr;
  std::unique_ptr<TextTokenizer>& slot = (*loaded)[name];
  slot = *std::move(t);
  return slot.get();
}

// " 1 2 3": ids for a failure message.
inline std::string ShowIds(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) {
    s += ' ';
    s += std::to_string(id);
  }
  return s;
}

}  // namespace heavykv::testing
