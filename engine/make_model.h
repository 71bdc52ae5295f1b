// Random-weight checkpoints in the llama2.c format, at named real-model shapes or explicit dims,
// so benchmarks and tests run at real sizes without downloading weights.
#pragma once

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "engine/model.h"

namespace heavykv {

// stories15M, stories110M, llama3-1b (GQA: 32 query / 8 kv heads), stories260K.
absl::StatusOr<ModelConfig> NamedShape(absl::string_view name);
std::string NamedShapeList();

// Writes a checkpoint with the given shape (shared classifier when config.shared_classifier)
// and weights drawn deterministically from `seed`: matrices uniform in +-1/sqrt(fan_in), norms 1.
absl::Status WriteRandomModel(const ModelConfig& config, uint64_t seed, const std::string& path);

}  // namespace heavykv
