// TextStream: turns a sequence's tokens into text deltas for streaming.
//
// Deltas never end inside a UTF-8 character (held-back text for stop strings may cut one), are
// always valid UTF-8 (an impossible byte becomes U+FFFD, as the proto's string fields need), and
// follow run.c's piece rules (the space after BOS is dropped, an unprintable single-byte piece
// prints nothing), so a stream concatenates to what `heavykv run` prints. Stop strings are found
// across token boundaries: the last (longest stop - 1) bytes are held back until more text
// arrives, and a matched stop string (the earliest in the text) is not included in the output
// (vLLM's default). With run.c's text rules (a llama2.c tokenizer.bin), a lone byte-fallback token
// >= 0x80 prints nothing, as in run.c; every other tokenizer's byte tokens join into characters.
// Control tokens (EOS, <|im_end|>, ...) add their text unless `skip_special` (vLLM's and Hugging
// Face's skip_special_tokens, on by default).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "engine/tokenizer/text_tokenizer.h"

namespace heavykv {

class TextStream {
 public:
  // `tokenizer` may be null (token ids only: every delta is empty). `prev_token` is the last
  // prompt token, which the first generated token's piece follows.
  TextStream(const TextTokenizer* tokenizer, int32_t prev_token, std::vector<std::string> stops,
             bool skip_special = true);

  // Adds a generated token; returns the text that became final. Sets *stopped when a stop string
  // was completed (the text before it is returned; later tokens must not be pushed).
  std::string Push(int32_t token, bool* stopped);
  // The text still held back, at the end of the generation.
  std::string Flush();

  // The length of the well-formed UTF-8 character that `s` starts with (no overlong forms, no
  // surrogates, at most U+10FFFF), or 0.
  static size_t WholeCharLength(absl::string_view s);
  // The longest prefix of `s` that does not end inside a possibly valid UTF-8 character.
  static size_t CompletePrefix(absl::string_view s);
  // `s` with each maximal ill-formed UTF-8 subpart replaced by one U+FFFD (as Python and
  // browsers decode).
  static std::string Sanitize(absl::string_view s);

 private:
  const TextTokenizer* tokenizer_;
  int32_t prev_;
  std::vector<std::string> stops_;
  size_t hold_ = 0;  // bytes that may begin a stop string: longest stop - 1
  std::string pending_;
  bool skip_special_;
};

}  // namespace heavykv
