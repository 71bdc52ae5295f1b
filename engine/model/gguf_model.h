// LoadGgufModel: a Model (engine/model/model.h) from a GGUF file of architecture llama, qwen2 or
// qwen3 whose weights are F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q5_K or Q6_K. LoadModel calls it
// when a file starts with the GGUF magic:
//
//   absl::StatusOr<GgufFile> f = GgufFile::Open(path);
//   absl::StatusOr<Model> m = LoadGgufModel(*f, cpu::WeightType::kFp32);
//
// Tensor names, shapes (ggml order: dims[0] is the row length) and metadata keys (prefixed by the
// architecture: llama.*, qwen2.*, qwen3.*) are llama.cpp's:
//   token_embd.weight [dim, vocab], output_norm.weight [dim], output.weight [dim, vocab] (absent:
//   tied to the embedding), rope_freqs.weight [head_dim/2] (Llama 3.1), blk.N.attn_norm /
//   ffn_norm [dim], attn_q [dim, q_dim], attn_k / attn_v [dim, kv_dim], attn_output [q_dim, dim],
//   ffn_gate / ffn_up [dim, hidden], ffn_down [hidden, dim]; qwen2: attn_q / attn_k / attn_v
//   .bias [q_dim | kv_dim]; qwen3: attn_q_norm / attn_k_norm [head_dim].
// The q and k rows are used as stored: llama.cpp's llama rope (LLAMA_ROPE_TYPE_NORM) rotates
// adjacent pairs (2i, 2i+1) as run.c does, and its Hugging Face converter permutes q/k into that
// order while the llama2.c converter copies run.c's rows unchanged, so no un-permuting is needed.
// qwen2 and qwen3 use NEOX rope (halves of a head), as their converter leaves q/k in HF order.
//
// Weight-type dispatch: F32 matrices are packed as fp32 PackedMatrix panels (bf16 with
// `weights` kBf16), BF16 matrices as bf16 panels (exact); F16 and quantized matrices are copied
// block for block into QuantMatrix parts (cpu::Linear), so resident weight bytes equal the file's
// tensor bytes for every type but F32 under --weight-dtype bf16 (half). Norms, biases and rope
// factors are fp32 vectors. Memory: from a `const GgufFile&` the Model owns copies of
// everything and the caller may close the file; from a shared_ptr (LoadModel) the F16 and
// quantized matrices stay in the read-only mapping, which the Model keeps open (load time is
// then the page cache's, as llama.cpp's mmap loading).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/gguf/gguf.h"
#include "engine/model/model.h"

namespace heavykv {

// The configuration from the metadata (ARCH.embedding_length, feed_forward_length, block_count,
// attention.head_count, attention.head_count_kv (default: head_count), context_length,
// attention.layer_norm_rms_epsilon, rope.freq_base (default 10000), attention.key_length (the head
// size; default dim / heads)), the architecture's fixed traits (rope style, biases, q/k norm) and
// the vocabulary size from token_embd.weight. INVALID_ARGUMENT naming the missing or wrong key or
// tensor, or an unknown architecture; UNIMPLEMENTED for what the runner does not do (partial
// rotary, values wider than keys, rope scaling other than rope_freqs.weight).
absl::StatusOr<ModelConfig> ReadGgufModelConfig(const GgufFile& file);

// The configuration, then every tensor checked (present, shape, type) before it is converted.
// INVALID_ARGUMENT naming a missing tensor, a wrong shape or a type that is not a weight type
// (or a quantized vector). `weights` as in LoadModel, for the float-typed matrices only.
// This overload copies every tensor out of `file`, which may be closed afterwards.
absl::StatusOr<Model> LoadGgufModel(const GgufFile& file, cpu::WeightType weights);
// The same, but F16 and quantized matrices are views of the file's mapping (cpu::QuantMatrix::
// View) that share ownership of `file`: the mapping stays open as long as the Model (or any
// copy of its matrices) lives, and loading copies none of those bytes. What LoadModel does.
absl::StatusOr<Model> LoadGgufModel(std::shared_ptr<const GgufFile> file,
                                    cpu::WeightType weights);

}  // namespace heavykv
