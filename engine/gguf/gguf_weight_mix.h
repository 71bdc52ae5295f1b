// GgufWeightMix: which ggml type each tensor of a GGUF model gets for a `--weight-type` name, the
// way llama-quantize chooses them (llama.cpp src/llama-quant.cpp, llama_tensor_get_type), so
// files that make-model writes have the layouts of the files people download.
//
//   absl::StatusOr<GgufWeightMix> mix = ParseGgufWeightMix("q4_k_m");
//   GgmlType t = GgufTensorType(*mix, {"blk.3.ffn_down.weight", {14336, 4096}, 3, 32, true});
//
// Rules, for the Llama-like architectures (llama, qwen2, qwen3):
//   - 1-D tensors (norms, biases) stay F32.
//   - f32, f16, bf16: every matrix that type (convert_hf_to_gguf.py --outtype).
//   - q8_0, q4_0, q5_0, q4_k, q5_k, q6_k: every matrix that type, token embedding and classifier
//     included (llama-quantize --pure; q4_k and q5_k record file type Q4_K_S / Q5_K_S).
//   - q4_k_m, q5_k_m: Q4_K / Q5_K, except: the classifier (output.weight, or token_embd.weight
//     when the embedding is tied) Q6_K; attn_v and ffn_down Q6_K in the layers use_more_bits
//     picks (the first and last eighth, and every third in between).
//   - A row length that the chosen type's block does not divide falls back as llama.cpp does:
//     the classifier to Q8_0, Q4_K to Q5_0, Q6_K to Q8_0, and Q5_K to Q5_0 (llama.cpp takes Q5_1,
//     which heavykv has no kernel for); when that block does not divide either, F16.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/cpu/ggml_types.h"

namespace heavykv {

struct GgufWeightMix {
  std::string name;      // "q4_k_m"
  GgmlType base;         // the type most matrices get
  uint32_t file_type;    // llama_ftype, written as general.file_type
  bool mostly = false;   // a llama-quantize mix (_M): the per-tensor rules above apply
};

// The mix for a --weight-type name (case-insensitive); INVALID_ARGUMENT listing the names.
absl::StatusOr<GgufWeightMix> ParseGgufWeightMix(absl::string_view name);
// "f32, f16, bf16, q8_0, q4_0, q5_0, q4_k, q5_k, q6_k, q4_k_m, q5_k_m"
std::string GgufWeightMixList();

// What GgufTensorType needs to know about one tensor.
struct GgufTensorSlot {
  absl::string_view name;          // GGUF name, "blk.3.attn_v.weight"
  std::span<const int64_t> dims;   // dims[0] the row length
  int32_t layer = -1;              // its block, -1 for token_embd, output, output_norm
  int32_t num_layers = 0;
  bool has_output = true;          // false: token_embd is the classifier too (tied)
};

GgmlType GgufTensorType(const GgufWeightMix& mix, const GgufTensorSlot& slot);

}  // namespace heavykv
