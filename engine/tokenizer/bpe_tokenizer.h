// BpeTokenizer: byte-level BPE, the tokenizer of GPT-2, Llama 3, Qwen2/2.5/3, SmolLM2, DeepSeek
// and most recent models (a GGUF's tokenizer.ggml.model "gpt2"; engine/tokenizer/gguf_tokenizer.h
// loads it):
//
//   absl::StatusOr<BpeTokenizer> t = BpeTokenizer::Create(std::move(vocab), "model.gguf");
//   std::vector<int32_t> ids = t->Encode("Hello world", t->add_bos(), t->add_eos());
//   std::string bytes = t->Decode(ids[1]);   // raw bytes; may end inside a UTF-8 character
//
// Vocabulary entries are written in GPT-2's byte-to-unicode alphabet (each byte one printable
// code point: ' ' is "Ġ", '\n' is "Ċ"); merges are "left right" pairs, ranked by their order.
// Encode:
//   1. Control (type 3) and user-defined (type 4) tokens written in the text become those tokens,
//      leftmost first and the longest at a position (Hugging Face's added-token matching).
//   2. The text between them is cut into pre-tokens by the PreTokenizer
//   (engine/tokenizer/bpe_pretokenizer.h).
//   3. Each pre-token's bytes start as one symbol each; the adjacent pair with the lowest merge
//      rank (leftmost on ties) merges until none has a rank. A linked list and a heap of candidate
//      pairs make this O(n log n) in the pre-token's length. With ignore_merges (Llama 3), a
//      pre-token that is itself a vocabulary entry is that token.
//   4. BOS / EOS when asked for and the vocabulary has them.
// Every byte sequence encodes (invalid UTF-8 bytes are pre-tokens of their own), and decoding the
// ids gives the text back when the vocabulary has a token for each of the 256 bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/tokenizer/bpe_pretokenizer.h"
#include "engine/tokenizer/special_tokens.h"
#include "engine/tokenizer/text_tokenizer.h"

namespace heavykv {

class BpeTokenizer : public TextTokenizer {
 public:
  // What a tokenizer is made from (a GGUF's tokenizer.ggml.* keys).
  struct Vocab {
    std::vector<std::string> tokens;  // byte-level alphabet; control/user-defined: raw text
    std::vector<int32_t> types;       // TokenType per token, or empty (all normal)
    std::vector<std::string> merges;  // "left right", best first
    std::string pre = "default";      // PreTokenizer::Create's name
    int32_t bos_id = -1;              // -1: none
    int32_t eos_id = -1;
    int32_t unknown_id = -1;      // stands for a byte the vocabulary has no token for; -1: dropped
    std::optional<bool> add_bos;  // unset: the pre-tokenizer's default (true for Llama 3)
    bool add_eos = false;
    std::vector<int32_t> eog_ids;  // ends of generation besides EOS (GGUF eot / eom token ids)
    // Special tokens that take the whitespace after them (Phi-3's;
    // engine/tokenizer/special_tokens.h).
    std::vector<int32_t> rstrip_ids;
  };

  // INVALID_ARGUMENT naming `source` and the entry: counts that differ, an id out of range, a
  // merge that is not "left right" or names a token (or a merged token) the vocabulary lacks, an
  // unknown pre-tokenizer.
  static absl::StatusOr<BpeTokenizer> Create(Vocab vocab, absl::string_view source);

  // TextTokenizer::Encode. With `parse_special` false, control tokens written in the text are
  // plain text (llama.cpp's parse_special = false); user-defined tokens are matched either way.
  using TextTokenizer::Encode;
  std::optional<std::vector<int32_t>> Encode(std::string_view text, bool bos, bool eos,
                                             const std::function<bool()>& should_stop,
                                             bool parse_special) const override;
  // The bytes `token` stands for: a normal token's bytes (possibly part of a UTF-8 character;
  // engine/tokenizer/text_stream.h joins them), a control or user-defined token's text; empty out
  // of range.
  const std::string& Decode(int32_t token) const;
  // Byte-level BPE has no dummy-prefix space to strip after BOS: `prev_token` does not matter.
  std::string Decode(int32_t /*prev_token*/, int32_t token) const override { return Decode(token); }
  bool IsControl(int32_t id) const override {
    return id >= 0 && id < vocab_size() && types_[id] == kControl;
  }
  std::string Describe() const override;

  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  // The vocabulary entry as written (byte-level alphabet for normal tokens).
  const std::string& piece(int32_t id) const override { return pieces_[id]; }
  TokenType type(int32_t id) const { return types_[id]; }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  bool add_bos() const override { return add_bos_; }
  bool add_eos() const override { return add_eos_; }
  // The tokens that end a generation, sorted: EOS, Vocab::eog_ids, and the chat templates' turn
  // ends found by their text (<|eot_id|>, <|im_end|>, <|end|>, <end_of_turn>, <|endoftext|>,
  // <|eom_id|>, <EOT>), as llama.cpp collects them: a Llama 3 GGUF's EOS is <|end_of_text|>, but
  // an instruct model ends its turn with <|eot_id|>.
  const std::vector<int32_t>& eog_ids() const { return eog_ids_; }
  bool IsEndOfGeneration(int32_t id) const override;
  const PreTokenizer& pre_tokenizer() const { return pre_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t id;  // the merged token
  };
  class Workspace;  // per-Encode scratch buffers (bpe_tokenizer.cc)

  explicit BpeTokenizer(PreTokenizer pre) : pre_(std::move(pre)) {}
  // Appends the ids of one pre-token (raw bytes) to the workspace's output; false when stopped.
  bool EncodeWord(std::string_view word, Workspace* ws) const;
  // Appends the ids of text that holds no special tokens; false when stopped.
  bool EncodeText(std::string_view text, Workspace* ws) const;
  static uint64_t PairKey(int32_t left, int32_t right) {
    return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
  }

  PreTokenizer pre_;
  std::vector<std::string> pieces_;  // [vocab_size]
  std::vector<TokenType> types_;     // [vocab_size]
  std::vector<std::string> bytes_;   // [vocab_size] what each token decodes to
  absl::flat_hash_map<std::string, int32_t> ids_by_bytes_;  // normal tokens' bytes -> id
  absl::flat_hash_map<uint64_t, Merge> merges_;             // PairKey(left, right) -> merge
  int32_t byte_ids_[256];                                   // byte -> its token, or -1
  SpecialTokenMatcher specials_;  // control and user-defined tokens: what Encode matches in text
  int32_t bos_id_ = -1, eos_id_ = -1, unknown_id_ = -1;
  bool add_bos_ = false, add_eos_ = false;
  std::vector<int32_t> eog_ids_;
};

}  // namespace heavykv
