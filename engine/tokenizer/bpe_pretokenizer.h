// PreTokenizer: splits text into the pieces ("pre-tokens") that byte-level BPE merges within, by
// the regular expressions a GGUF's `tokenizer.ggml.pre` names (Hugging Face's Split pre-tokenizers
// with the "isolated" behaviour):
//
//   absl::StatusOr<PreTokenizer> pre = PreTokenizer::Create("llama-bpe");
//   std::vector<PreTokenizer::Span> spans;
//   pre->Split(text, &spans);   // [begin, end) byte ranges that tile `text`, in order
//
// A pre-tokenizer is a sequence of PCRE2 patterns (UTF, UCP, JIT-compiled where PCRE2 has a JIT).
// The first pattern cuts the text into its matches and the runs between them; each later pattern
// cuts every piece the same way, matching within that piece only (a lookahead or `$` sees the
// piece's end). Bytes that are not valid UTF-8 are pieces of one byte each, so every input splits
// and byte-level BPE can encode it. Split is const and safe to call from many threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace heavykv {

class PreTokenizer {
 public:
  struct Span {
    size_t begin = 0;
    size_t end = 0;
  };

  // The pre-tokenizer `tokenizer.ggml.pre` names (llama.cpp's names: "default", "llama-bpe",
  // "qwen2", "gpt-2", "smollm", "deepseek-llm", "deepseek-coder", "falcon", "mpt", "starcoder",
  // "refact", "tekken", ... see Names()). INVALID_ARGUMENT naming an unknown one.
  static absl::StatusOr<PreTokenizer> Create(absl::string_view name);
  // A pre-tokenizer from explicit patterns, applied in order (tests and new vocabularies).
  // INVALID_ARGUMENT with PCRE2's message and offset when a pattern does not compile.
  static absl::StatusOr<PreTokenizer> FromPatterns(const std::vector<std::string>& patterns,
                                                   absl::string_view name);
  // Every name Create accepts, sorted.
  static std::vector<std::string> Names();

  // Appends the pieces of `text` to `spans` (offsets into `text`; empty text, no pieces).
  void Split(std::string_view text, std::vector<Span>* spans) const;

  const std::string& name() const { return name_; }
  // Whether a whole pre-token that is itself a vocabulary entry is taken as that token, merges or
  // not (Hugging Face's BPE `ignore_merges`, which Llama 3's and Tekken's tokenizers set).
  bool ignore_merges() const { return ignore_merges_; }
  // Whether the tokenizer adds BOS when the GGUF has no tokenizer.ggml.add_bos_token.
  bool default_add_bos() const { return default_add_bos_; }

 private:
  struct Pattern;  // one compiled PCRE2 pattern
  // Cuts each of `in` (valid UTF-8) by `pattern` into `out`.
  static void Apply(const Pattern& pattern, std::string_view text, const std::vector<Span>& in,
                    std::vector<Span>* out);

  std::string name_;
  std::vector<std::shared_ptr<const Pattern>> patterns_;  // immutable, shared by copies
  bool ignore_merges_ = false;
  bool default_add_bos_ = false;
};

}  // namespace heavykv
