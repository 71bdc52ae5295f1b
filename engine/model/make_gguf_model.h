// Random-weight GGUF models (make-model --format gguf): the tensors, metadata and vocabulary that
// llama.cpp's converters and llama-quantize write for the llama, qwen2 and qwen3 architectures,
// with deterministic random values, so heavykv and llama.cpp can be benchmarked on the same file
// at real sizes without downloading weights.
//
//   RandomGgufOptions o;
//   o.config = *NamedShape("llama3.2-1b");
//   o.weights = *ParseGgufWeightMix("q4_k_m");
//   absl::StatusOr<ModelConfig> written = WriteRandomGgufModel(o, "/tmp/l1b.gguf");
//
// The file streams: tensors are drawn, quantized (kernels/cpu/quant_types.h, llama.cpp's reference
// quantizers) and written a chunk of rows at a time, in parallel over rows (OpenMP), so an 8B
// model needs tens of MB of memory, not its fp32 copy.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/gguf/gguf_weight_mix.h"
#include "engine/model/model.h"
#include "kernels/cpu/ggml_types.h"

namespace heavykv {

struct RandomGgufOptions {
  ModelConfig config;  // arch, sizes, rope theta, eps; shared_classifier: no output.weight
  GgufWeightMix weights;
  uint64_t seed = 1;
  std::string name = "random";  // general.name
  // A GGUF file whose tokenizer.* keys are copied; the vocabulary size becomes its token count.
  // Empty: a minimal SentencePiece vocabulary of config.vocab_size pieces (at least 259).
  std::string vocab_from;
  // Called after each chunk written with the tensor bytes written so far and in all; may be empty.
  std::function<void(int64_t done, int64_t total)> progress;
};

// One tensor of the file and how its values are drawn: uniform in +-scale, or all equal to
// `scale` when `constant` (norms).
struct RandomTensorPlan {
  std::string name;            // "blk.0.attn_q.weight"
  std::vector<int64_t> dims;   // ggml order: dims[0] the row length
  GgmlType type;
  float scale;
  bool constant;
};

// The tensors of a model of this config, in file order, each with the type `mix` gives it
// (GgufTensorType). Matrices: uniform in +-1/sqrt(row length), token_embd in +-1 (as
// WriteRandomModel); norms 1; biases in +-0.02.
std::vector<RandomTensorPlan> PlanRandomGgufTensors(const ModelConfig& c, const GgufWeightMix& mix);

// out[dims[0]] = row `row` of the tensor, drawn from `seed` and the tensor's name alone, so rows
// are drawn in any order and a test redraws any one.
void DrawRandomRow(const RandomTensorPlan& t, uint64_t seed, int64_t row, float* out);

// Writes the model to `path` and returns the config written (vocab_size from --vocab-from).
// INVALID_ARGUMENT for an invalid config, a vocabulary file without tokenizer.ggml.tokens, or a
// minimal vocabulary under 259 pieces; the parser's error for an unreadable vocabulary file;
// DATA_LOSS / INVALID_ARGUMENT naming `path` when it cannot be written.
absl::StatusOr<ModelConfig> WriteRandomGgufModel(const RandomGgufOptions& options,
                                                 const std::string& path);

}  // namespace heavykv
