// CheckGgufSupported: whether heavykv can run the model in a GGUF file, answered from the file's
// metadata and tensor types alone (no weights are read). `heavykv inspect` prints the answer; the
// GGUF model loader (engine/model/gguf_model.h) gives the same verdicts, naming the file.
#pragma once

#include <span>

#include "absl/status/status.h"
#include "engine/gguf/gguf.h"
#include "kernels/cpu/ggml_types.h"

namespace heavykv {

// The architectures (general.architecture) and tensor types the loader is meant to run.
std::span<const absl::string_view> SupportedGgufArchitectures();
std::span<const GgmlType> SupportedGgmlTypes();

// OK when heavykv runs the model; otherwise the reason, without the file name (the caller adds
// it): INVALID_ARGUMENT for an unknown architecture, a tensor of another type, or a file without
// tensors, a missing key or tensor; UNIMPLEMENTED for what the runner does not do (partial
// rotary, rope scaling other than Llama 3.1's rope_freqs, values wider than keys).
absl::Status CheckGgufSupported(const GgufFile& file);

}  // namespace heavykv
