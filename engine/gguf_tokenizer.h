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
#include "engine/bpe_tokenizer.h"
#include "engine/gguf.h"
#include "engine/tokenizer.h"

namespace heavykv {

// NOT_FOUND when the file has no tokenizer.ggml.model; UNIMPLEMENTED naming another tokenizer
// model (gpt2 and the rest: issue 15); INVALID_ARGUMENT naming the key when the vocabulary is
// malformed or its size is not `vocab_size`.
absl::StatusOr<Tokenizer> LoadGgufTokenizer(const GgufFile& file, int32_t vocab_size);

// The BpeTokenizer (engine/bpe_tokenizer.h) of a GGUF whose tokenizer.ggml.model is "gpt2"
// (byte-level BPE): tokenizer.ggml.tokens, .token_type (optional), .merges, .pre (absent:
// "default", as llama.cpp has it), .bos_token_id, .eos_token_id, .unknown_token_id,
// .eot_token_id, .eom_token_id, .add_bos_token and .add_eos_token (each optional). NOT_FOUND without tokenizer.ggml.model;
// UNIMPLEMENTED for another model; INVALID_ARGUMENT naming the key when the vocabulary is
// malformed, its size is not `vocab_size`, or the pre-tokenizer is unknown. The tokenizer copies
// what it needs.
absl::StatusOr<BpeTokenizer> LoadGgufBpeTokenizer(const GgufFile& file, int32_t vocab_size);

}  // namespace heavykv
