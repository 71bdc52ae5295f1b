// LoadGgufModel: a Model (engine/model.h) from a GGUF file of architecture `llama` whose weights
// are F32, F16 or BF16. LoadModel calls it when a file starts with the GGUF magic:
//
//   absl::StatusOr<GgufFile> f = GgufFile::Open(path);
//   absl::StatusOr<Model> m = LoadGgufModel(*f, cpu::WeightType::kFp32);
//
// Tensor names, shapes (ggml order: dims[0] is the row length) and metadata keys are llama.cpp's:
//   token_embd.weight [dim, vocab], output_norm.weight [dim], output.weight [dim, vocab] (absent:
//   tied to the embedding), blk.N.attn_norm / ffn_norm [dim], attn_q [dim, dim], attn_k / attn_v
//   [dim, kv_dim], attn_output [dim, dim], ffn_gate / ffn_up [dim, hidden], ffn_down [hidden, dim].
// The q and k rows are used as stored: llama.cpp's llama rope (LLAMA_ROPE_TYPE_NORM) rotates
// adjacent pairs (2i, 2i+1) as run.c does, and its Hugging Face converter permutes q/k into that
// order while the llama2.c converter copies run.c's rows unchanged, so no un-permuting is needed.
//
// The weights are converted to fp32 (or packed as bf16) into the Model, which owns them; nothing
// points into the mapping afterwards, so the caller may close the GgufFile.
#pragma once

#include "absl/status/statusor.h"
#include "engine/gguf.h"
#include "engine/model.h"

namespace heavykv {

// The configuration from the metadata (llama.embedding_length, feed_forward_length, block_count,
// attention.head_count, attention.head_count_kv (default: head_count), context_length,
// attention.layer_norm_rms_epsilon, rope.freq_base (default 10000)) and the vocabulary size from
// token_embd.weight. INVALID_ARGUMENT naming the missing or wrong key or tensor; UNIMPLEMENTED for
// what the runner does not do yet (another architecture, partial rotary, rope scaling).
absl::StatusOr<ModelConfig> ReadGgufModelConfig(const GgufFile& file);

// The configuration, then every tensor checked (present, shape, type) before it is converted.
// INVALID_ARGUMENT naming a missing tensor, a wrong shape or a type that is not a weight type;
// UNIMPLEMENTED naming the first quantized tensor and its type (the runner takes fp32 / bf16
// weights only, for now). `weights` as in LoadModel.
absl::StatusOr<Model> LoadGgufModel(const GgufFile& file, cpu::WeightType weights);

}  // namespace heavykv
