// Tokenizer: the llama2.c BPE tokenizer (tokenizer.bin format), byte-for-byte compatible with
// llama2.c run.c's encode() and decode().
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

namespace heavykv {

inline constexpr int32_t kBosId = 1;
inline constexpr int32_t kEosId = 2;

class Tokenizer {
 public:
  // Loads a llama2.c tokenizer file whose vocabulary must have exactly `vocab_size` tokens.
  static absl::StatusOr<Tokenizer> Load(const std::string& path, int32_t vocab_size);
  // The same tokenizer from its pieces and scores (as a tokenizer file would hold them, spaces as
  // ' '), e.g. a GGUF file's (engine/gguf_tokenizer.h). INVALID_ARGUMENT when the counts differ
  // or there are fewer than 259 pieces; `source` names them in errors.
  static absl::StatusOr<Tokenizer> FromPieces(std::vector<std::string> pieces,
                                              std::vector<float> scores,
                                              absl::string_view source);

  std::vector<int32_t> Encode(std::string_view text, bool bos, bool eos) const;
  // The same ids, or std::nullopt once `should_stop` returns true. It is called every few
  // thousand steps (bytes split, pairs queued or merged), from this thread, so it must be cheap
  // and thread-compatible; e.g. a request's cancel flag and deadline. An empty function never
  // stops. Encode is const and safe to run concurrently on one Tokenizer.
  std::optional<std::vector<int32_t>> Encode(std::string_view text, bool bos, bool eos,
                                             const std::function<bool()>& should_stop) const;
  // The bytes of `token` when it follows `prev_token` (run.c decode()).
  std::string Decode(int32_t prev_token, int32_t token) const;
  // run.c safe_printf(): a piece that is a single unprintable, non-space byte prints as nothing.
  static bool IsPrintablePiece(std::string_view piece);

  int32_t vocab_size() const { return static_cast<int32_t>(pieces_.size()); }
  const std::string& piece(int32_t id) const { return pieces_[id]; }
  float score(int32_t id) const { return scores_[id]; }

 private:
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int32_t> ids_;   // piece -> id (first id on duplicates)
  int32_t Lookup(const std::string& piece) const;  // the id of `piece`, or -1

  int32_t max_token_length_ = 0;
};

}  // namespace heavykv
