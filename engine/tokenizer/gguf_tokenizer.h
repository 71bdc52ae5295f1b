// The tokenizer a GGUF file carries in its tokenizer.ggml.* metadata:
//
//   absl::StatusOr<std::unique_ptr<TextTokenizer>> t = LoadGgufTextTokenizer(file, vocab_size);
//
// tokenizer.ggml.model "llama" is SentencePiece (Tokenizer, engine/tokenizer/tokenizer.h): .tokens
// (U+2581 "▁" standing for a space), .scores, .token_type, ids 3..258 the byte tokens
// <0x00>..<0xFF>. "gpt2" is byte-level BPE (BpeTokenizer, engine/tokenizer/bpe_tokenizer.h):
// .tokens, .token_type, .merges, .pre (absent: "default", as llama.cpp has it). Both read, when
// present, .bos_token_id, .eos_token_id, .unknown_token_id, .eot_token_id, .eom_token_id,
// .add_bos_token, .add_eos_token, .fim_{pre,suf,mid,pad,rep,sep}_token_id, and SentencePiece
// .add_space_prefix. Like llama.cpp, the loader also goes by token texts and general.name where the
// keys say nothing: turn-end and fill-in-the-middle tokens are control tokens, the FIM pad /
// repository / file separator tokens end a generation, and Phi-3's special tokens take the
// whitespace after them (gguf_tokenizer.cc, ApplyLlamaCppRules). The tokenizer copies what it
// needs: the GgufFile may be closed afterwards.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/gguf/gguf.h"
#include "engine/tokenizer/bpe_tokenizer.h"
#include "engine/tokenizer/text_tokenizer.h"
#include "engine/tokenizer/tokenizer.h"

namespace heavykv {

// NOT_FOUND when the file has no tokenizer.ggml.model; UNIMPLEMENTED naming another tokenizer
// model (bert's "wpm", t5's "ugm", rwkv, ...); INVALID_ARGUMENT naming the key when the
// vocabulary is malformed, its size is not `vocab_size`, or the pre-tokenizer is unknown.
absl::StatusOr<std::unique_ptr<TextTokenizer>> LoadGgufTextTokenizer(const GgufFile& file,
                                                                     int32_t vocab_size);
// The same for one kind: "llama" only / "gpt2" only (UNIMPLEMENTED for the other).
absl::StatusOr<Tokenizer> LoadGgufTokenizer(const GgufFile& file, int32_t vocab_size);
absl::StatusOr<BpeTokenizer> LoadGgufBpeTokenizer(const GgufFile& file, int32_t vocab_size);

}  // namespace heavykv
