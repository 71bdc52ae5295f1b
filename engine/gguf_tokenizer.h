// LoadGgufTokenizer: the Tokenizer (engine/tokenizer.h) that a GGUF file carries in its metadata,
// for tokenizer.ggml.model "llama" (SentencePiece with byte fallback, as llama2.c runs it):
//
//   absl::StatusOr<Tokenizer> t = LoadGgufTokenizer(file, model.config.vocab_size);
//
// Keys: tokenizer.ggml.tokens (pieces, U+2581 "▁" standing for a space), tokenizer.ggml.scores,
// and tokenizer.ggml.{unknown,bos,eos}_token_id when present, which must be 0, 1, 2 as the
// Tokenizer has them; ids 3..258 must be the byte tokens <0x00>..<0xFF>. The Tokenizer copies what
// it needs: the GgufFile may be closed afterwards.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "engine/gguf.h"
#include "engine/tokenizer.h"

namespace heavykv {

// NOT_FOUND when the file has no tokenizer.ggml.model; UNIMPLEMENTED naming another tokenizer
// model (gpt2 and the rest: issue 15); INVALID_ARGUMENT naming the key when the vocabulary is
// malformed or its size is not `vocab_size`.
absl::StatusOr<Tokenizer> LoadGgufTokenizer(const GgufFile& file, int32_t vocab_size);

}  // namespace heavykv
