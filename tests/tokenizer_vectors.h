// llama.cpp's tokenizer test vectors (tests/test-tokenizer-0 format), as tests/data/gguf/*.inp and
// *.out hold them: inputs separated by lines "__ggml_vocab_test__", one line of space-separated
// ids per input (llama.cpp's ids without BOS).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

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

}  // namespace heavykv::testing
