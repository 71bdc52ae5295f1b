#include "engine/gguf/gguf_weight_mix.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace heavykv {
namespace {

// llama_ftype values (llama.h).
constexpr uint32_t kFtypeF32 = 0, kFtypeF16 = 1, kFtypeQ4_0 = 2, kFtypeQ8_0 = 7, kFtypeQ5_0 = 8,
                   kFtypeQ4_K_S = 14, kFtypeQ4_K_M = 15, kFtypeQ5_K_S = 16, kFtypeQ5_K_M = 17,
                   kFtypeQ6_K = 18, kFtypeBF16 = 32;

const GgufWeightMix kMixes[] = {
    {"f32", GgmlType::kF32, kFtypeF32},      {"f16", GgmlType::kF16, kFtypeF16},
    {"bf16", GgmlType::kBF16, kFtypeBF16},   {"q8_0", GgmlType::kQ8_0, kFtypeQ8_0},
    {"q4_0", GgmlType::kQ4_0, kFtypeQ4_0},   {"q5_0", GgmlType::kQ5_0, kFtypeQ5_0},
    {"q4_k", GgmlType::kQ4_K, kFtypeQ4_K_S}, {"q5_k", GgmlType::kQ5_K, kFtypeQ5_K_S},
    {"q6_k", GgmlType::kQ6_K, kFtypeQ6_K},   {"q4_k_m", GgmlType::kQ4_K, kFtypeQ4_K_M, true},
    {"q5_k_m", GgmlType::kQ5_K, kFtypeQ5_K_M, true},
};

bool Divides(GgmlType type, int64_t row) { return row % GgmlTypeInfoOf(type).block_size == 0; }

// llama.cpp's use_more_bits: the first and last eighth of the layers and every third between.
bool UseMoreBits(int32_t layer, int32_t num_layers) {
  return layer < num_layers / 8 || layer >= 7 * num_layers / 8 ||
         (layer - num_layers / 8) % 3 == 2;
}

}  // namespace

absl::StatusOr<GgufWeightMix> ParseGgufWeightMix(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  for (const GgufWeightMix& m : kMixes) {
    if (m.name == lower) return m;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown weight type \"", name,
                                                 "\"; choose one of: ", GgufWeightMixList()));
}

std::string GgufWeightMixList() {
  std::string out;
  for (const GgufWeightMix& m : kMixes) absl::StrAppend(&out, out.empty() ? "" : ", ", m.name);
  return out;
}

GgmlType GgufTensorType(const GgufWeightMix& mix, const GgufTensorSlot& slot) {
  if (slot.dims.size() < 2) return GgmlType::kF32;
  const int64_t row = slot.dims[0];
  GgmlType type = mix.base;
  const bool quantized = type != GgmlType::kF32 && type != GgmlType::kF16 &&
                         type != GgmlType::kBF16;
  if (!quantized) return type;
  const bool classifier = slot.name == "output.weight" ||
                          (!slot.has_output && slot.name == "token_embd.weight");
  if (mix.mostly) {
    if (classifier) {
      // llama.cpp decides the classifier's fallback here, from the mix's base block.
      type = Divides(type, row) ? GgmlType::kQ6_K : GgmlType::kQ8_0;
    } else if ((absl::StrContains(slot.name, "attn_v.weight") ||
                absl::StrContains(slot.name, "ffn_down")) &&
               UseMoreBits(slot.layer, slot.num_layers)) {
      type = GgmlType::kQ6_K;
    }
  }
  if (!Divides(type, row)) {
    switch (type) {
      case GgmlType::kQ4_K:
      case GgmlType::kQ5_K:
        type = GgmlType::kQ5_0;
        break;
      case GgmlType::kQ6_K:
        type = GgmlType::kQ8_0;
        break;
      default:
        type = GgmlType::kF16;
        break;
    }
    if (!Divides(type, row)) type = GgmlType::kF16;
  }
  return type;
}

}  // namespace heavykv
