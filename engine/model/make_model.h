// Random-weight checkpoints in the llama2.c format, at named real-model shapes or explicit dims,
// so benchmarks and tests run at real sizes without downloading weights. GGUF files of the same
// shapes: engine/model/make_gguf_model.h.
#pragma once

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "engine/model/model.h"

namespace heavykv {

// stories15M, stories110M, llama3-1b (GQA: 32 query / 8 kv heads), stories260K (llama2.c's
// defaults: rope theta 1e4, eps 1e-5), and real models' shapes with their architecture, rope theta,
// rms epsilon and embedding tying: llama3.2-1b (tied), llama3-8b, qwen2.5-0.5b (qwen2, tied),
// qwen3-0.6b (qwen3, head size 128, tied). Their seq_len is a benchmark's context, not the
// model's maximum (llama3.2-1b: 8192 of 131072).
absl::StatusOr<ModelConfig> NamedShape(absl::string_view name);
std::string NamedShapeList();

// Writes a checkpoint with the given shape (shared classifier when config.shared_classifier)
// and weights drawn deterministically from `seed`: matrices uniform in +-1/sqrt(fan_in), norms 1.
// INVALID_ARGUMENT for another architecture than llama or a head size other than dim / heads.
absl::Status WriteRandomModel(const ModelConfig& config, uint64_t seed, const std::string& path);

}  // namespace heavykv
