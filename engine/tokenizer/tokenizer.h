// Tokenizer: SentencePiece-style BPE over scored pieces with byte fallback. Two sources:
//   - llama2.c's tokenizer.bin (Load): byte-for-byte compatible with run.c's encode() and
//     decode(), quirks included (run_c_text_rules());
//   - a GGUF SentencePiece vocabulary (FromPieces with SentencePieceOptions, engine/
//     gguf_tokenizer.h): Llama 2, Mistral, Phi-3, TinyLlama, with llama.cpp's rules (below).
//
// File format: int32 max_token_length, then for each of vocab_size tokens: float32 score,
// int32 length, `length` bytes of the piece. Ids 0, 1, 2 are <unk>, <s> (BOS), </s> (EOS);
// pieces of the form "<0xNN>" are byte-fallback tokens.
//
// Encode: optional BOS; a dummy-prefix " " token when the text is non-empty; each UTF-8 code
// point looked up as a piece, else its bytes as <0xNN> tokens (id byte + 3); then repeatedly
// merge the adjacent pair whose concatenated piece exists with the highest score (first such pair
// on ties); optional EOS. The merges give run.c's ids but run in O(n log n) time and O(n) memory
// for n input bytes (run.c's loop is quadratic), and a caller can stop a long encode.
// Decode: a byte-fallback piece becomes that byte; after BOS a leading space is stripped.
//
// With SentencePieceOptions (GGUF): BOS/EOS ids and the add_bos/add_eos flags come from the file;
// control, user-defined and unknown tokens written in the text become single tokens (control and
// unknown ones only when parsing special tokens), and the plain text between them is encoded
// piece by piece as above, each with the dummy-prefix space when it follows a special token or
// starts the text (llama.cpp's add_space_prefix rule). A byte token >= 0x80 decodes to its byte
// (engine/tokenizer/text_stream.h joins a character's bytes) and generation stops at the
// end-of-generation tokens, not at BOS.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/tokenizer/special_tokens.h"
#include "engine/tokenizer/text_tokenizer.h"

namespace heavykv {

inline constexpr int32_t kBosId = 1;
inline constexpr int32_t kEosId = 2;

class Tokenizer : public TextTokenizer {
 public:
  // A GGUF SentencePiece vocabulary's tokenizer.ggml.* settings.
  struct SentencePieceOptions {
    std::vector<int32_t> types;  // GGUF token types per token (3 control, 4 user-defined,
                                 // 2 unknown, 6 byte); empty: all normal
    int32_t bos_id = kBosId;     // -1: none
    int32_t eos_id = kEosId;     // -1: none
    bool add_bos = true;
    bool add_eos = false;
    bool add_space_prefix = true;
    std::vector<int32_t> eog_ids;  // ends of generation besides EOS (GGUF eot / eom ids)
    // Special tokens that take the whitespace after them (Phi-3's;
    // engine/tokenizer/special_tokens.h).
    std::vector<int32_t> rstrip_ids;
  };

  // Loads a llama2.c tokenizer file whose vocabulary must have exactly `vocab_size` tokens.
  static absl::StatusOr<Tokenizer> Load(const std::string& path, int32_t vocab_size);
  // The same tokenizer from its pieces and scores (as a tokenizer file would hold them, spaces as
  // ' '), e.g. a GGUF file's (engine/tokenizer/gguf_tokenizer.h). INVALID_ARGUMENT when the counts
  // differ or there are fewer than 259 pieces; `source` names them in errors.
  // Without `sentencepiece` the tokenizer follows run.c's rules, as one Load gives.
  static absl::StatusOr<Tokenizer> FromPieces(
      std::vector<std::string> pieces, std::vector<float> scores, absl::string_view source,
      std::optional<SentencePieceOptions> sentencepiece = std::nullopt);

  // TextTokenizer::Encode; the stop check is polled per bytes split and pairs queued or merged.
  // run.c's rules parse no special tokens (`parse_special` does not matter).
  using TextTokenizer::Encode;
  std::optional<std::vector<int32_t>> Encode(std::string_view text, bool bos, bool eos,
                                             const std::function<bool()>& should_stop,
                                             bool parse_special) const override;
  // The bytes of `token` when it follows `prev_token` (run.c decode(); with run.c's rules a byte
  // token 0x00 gives "").
  std::string Decode(int32_t prev_token, int32_t token) const override;
  bool IsControl(int32_t id) const override;
  // run.c safe_printf(): a piece that is a single unprintable, non-space byte prints as nothing.
  static bool IsPrintablePiece(std::string_view piece);

  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  const std::string& piece(int32_t id) const override { return pieces_[id]; }
  float score(int32_t id) const { return scores_[id]; }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  bool add_bos() const override { return add_bos_; }
  bool add_eos() const override { return add_eos_; }
  // run.c: EOS and BOS; SentencePiece: EOS, the file's EOT/EOM ids and the turn-end tokens.
  bool IsEndOfGeneration(int32_t id) const override;
  bool run_c_text_rules() const override { return run_c_; }
  std::string Describe() const override { return run_c_ ? "llama2.c" : "sentencepiece"; }

 private:
  // Appends the symbols of `text` (the dummy-prefix space first when asked, then each UTF-8
  // code point's piece or its byte tokens) to `tokens`; false when stopped.
  class Poller;  // calls the caller's stop check every few thousand steps (tokenizer.cc)
  bool AppendSymbols(std::string_view text, bool dummy_prefix, Poller* stop,
                     std::vector<int32_t>* tokens) const;
  // Merges adjacent symbols in `tokens` by score; false when stopped.
  bool MergeSymbols(Poller* stop, std::vector<int32_t>* tokens) const;

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int32_t> ids_;   // piece -> id (first id on duplicates)
  int32_t Lookup(const std::string& piece) const;  // the id of `piece`, or -1

  int32_t max_token_length_ = 0;
  bool run_c_ = true;               // run.c's rules (a tokenizer.bin), else SentencePiece's
  std::vector<int32_t> types_;      // [vocab_size] GGUF token types; empty with run.c's rules
  int32_t bos_id_ = kBosId, eos_id_ = kEosId;
  bool add_bos_ = true, add_eos_ = false, add_space_prefix_ = true;
  std::vector<int32_t> eog_ids_;    // sorted
  SpecialTokenMatcher specials_;    // empty with run.c's rules
};

}  // namespace heavykv
