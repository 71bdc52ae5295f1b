// TextTokenizer: the one tokenizer interface that run, eval, serve, the engine's tokenizer thread,
// the request validator and TextStream use, whatever the model's vocabulary is:
//
//   Tokenizer (engine/tokenizer/tokenizer.h)      llama2.c tokenizer.bin, byte-for-byte run.c; and
//                                       SentencePiece vocabularies of GGUF files (model "llama")
//   BpeTokenizer (engine/tokenizer/bpe_tokenizer.h)  byte-level BPE of GGUF files (model "gpt2")
//
//   std::shared_ptr<const TextTokenizer> t = *LoadModelTokenizer(...);   // engine/tokenizer/gguf_tokenizer.h
//   std::vector<int32_t> ids = t->Encode("Hello", t->add_bos(), /*eos=*/false);
//   std::string bytes = t->Decode(prev, ids.back());   // may end inside a UTF-8 character
//
// All methods are const and safe to call concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace heavykv {

class TextTokenizer {
 public:
  // GGUF's tokenizer.ggml.token_type values.
  enum TokenType : int32_t {
    kNormal = 1,
    kUnknown = 2,
    kControl = 3,
    kUserDefined = 4,
    kUnused = 5,
    kByte = 6,
  };

  virtual ~TextTokenizer() = default;

  // The token ids of `text`: BOS first when `bos` (and the vocabulary has one), EOS last when
  // `eos`. With `parse_special`, control and user-defined tokens written in the text ("<|im_end|>",
  // "<s>") become those single tokens, as Hugging Face's tokenizers and llama.cpp do; without it
  // control tokens are plain text (content that must not inject a turn end). std::nullopt once
  // `should_stop` returns true: it is called every few thousand steps from this thread, so it must
  // be cheap (a cancel flag, a deadline); an empty function never stops.
  virtual std::optional<std::vector<int32_t>> Encode(std::string_view text, bool bos, bool eos,
                                                     const std::function<bool()>& should_stop,
                                                     bool parse_special) const = 0;
  // The same, never stopped, special tokens parsed.
  std::vector<int32_t> Encode(std::string_view text, bool bos, bool eos) const {
    return *Encode(text, bos, eos, std::function<bool()>(), /*parse_special=*/true);
  }

  // The bytes `token` stands for when it follows `prev_token` (a byte token is that one byte, so a
  // UTF-8 character may span tokens: engine/tokenizer/text_stream.h joins them). A control token
  // gives its text ("<|eot_id|>"); an id outside the vocabulary gives "".
  virtual std::string Decode(int32_t prev_token, int32_t token) const = 0;
  // Control tokens (BOS, EOS, turn markers): what `skip_special_tokens` leaves out of the text.
  virtual bool IsControl(int32_t id) const = 0;

  virtual int32_t vocab_size() const = 0;
  // The vocabulary entry as the file writes it (SentencePiece: U+2581 as ' '; byte-level BPE: its
  // byte alphabet), for `heavykv tokenize` and for sizing prompt limits.
  virtual const std::string& piece(int32_t id) const = 0;
  virtual int32_t bos_id() const = 0;  // -1: none
  virtual int32_t eos_id() const = 0;  // -1: none
  // Whether a prompt gets BOS / EOS (GGUF tokenizer.ggml.add_bos_token / add_eos_token).
  virtual bool add_bos() const = 0;
  virtual bool add_eos() const = 0;
  // The tokens that end a generation: EOS, the file's EOT/EOM ids and the chat templates' turn
  // ends (<|eot_id|>, <|im_end|>, <|end|>, <end_of_turn>, ...); for llama2.c also BOS (run.c).
  virtual bool IsEndOfGeneration(int32_t id) const = 0;
  // llama2.c's run.c text rules: a lone unprintable byte prints nothing, and generation also
  // stops at BOS. Only a tokenizer.bin follows them; a GGUF vocabulary decodes every byte.
  virtual bool run_c_text_rules() const { return false; }
  // What kind of vocabulary this is, for logs and `heavykv tokenize`: "llama2.c",
  // "sentencepiece" or "byte-level BPE (<pre-tokenizer>)".
  virtual std::string Describe() const = 0;
};

}  // namespace heavykv
