// SpecialTokenMatcher: finds the control and user-defined tokens written in a text ("<|im_end|>",
// "<s>"), which both tokenizers (engine/tokenizer/tokenizer.h, engine/tokenizer/bpe_tokenizer.h)
// encode as single tokens before they split the plain text between them. Hugging Face's added-token
// rule: the leftmost match first, and at one position the longest. A token marked `rstrip` (Hugging
// Face's AddedToken.rstrip, llama.cpp's LLAMA_TOKEN_ATTR_RSTRIP: Phi-3's turn markers) also takes
// the whitespace after it, which then is not encoded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace heavykv {

class SpecialTokenMatcher {
 public:
  // Adds token `id` written as `text` (not empty); `control` tokens are skipped by Find when it
  // is not to parse them (user-defined tokens always match). Call Finish after the last Add.
  void Add(int32_t id, std::string text, bool control, bool rstrip = false);
  void Finish();

  struct Match {
    size_t pos = std::string_view::npos;  // where it starts; npos: no special token left
    int32_t id = -1;
    size_t length = 0;
    size_t next = std::string_view::npos;  // where the plain text resumes: pos + length, and
                                           // past the whitespace after an rstrip token
  };
  // The first special token in `text` at or after `from`.
  Match Find(std::string_view text, size_t from, bool parse_control) const;
  bool empty() const { return count_ == 0; }

 private:
  struct Entry {
    int32_t id;
    bool control;
    bool rstrip;
    std::string text;
  };
  std::vector<std::vector<Entry>> by_first_byte_ = std::vector<std::vector<Entry>>(256);
  size_t count_ = 0;
};

// Whether a token written `text` ends a chat turn although the file does not name it EOS/EOT
// (<|eot_id|>, <|im_end|>, <|end|>, <end_of_turn>, <|endoftext|>, <|eom_id|>, <EOT>), as llama.cpp
// collects them: a Llama 3 GGUF's EOS is <|end_of_text|>, but an instruct model ends its turn
// with <|eot_id|>.
bool IsTurnEndText(std::string_view text);

}  // namespace heavykv
