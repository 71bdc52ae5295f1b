#include "engine/model/gguf_support.h"

#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "engine/model/gguf_model.h"

namespace heavykv {
namespace {

constexpr std::array<absl::string_view, 3> kArchitectures = {"llama", "qwen2", "qwen3"};
// What the Q4_K_M, Q5_K_M, Q6_K and Q8_0 files on the hub hold, and llama-quantize's fallbacks
// for rows that are not a multiple of 256 (issue 14, section 3).
constexpr std::array<GgmlType, 9> kTypes = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16,
                                            GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ5_0,
                                            GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};

}  // namespace

std::span<const absl::string_view> SupportedGgufArchitectures() { return kArchitectures; }
std::span<const GgmlType> SupportedGgmlTypes() { return kTypes; }

absl::Status CheckGgufSupported(const GgufFile& file) {
  absl::StatusOr<absl::string_view> arch = file.GetString("general.architecture");
  if (!arch.ok()) {
    return absl::InvalidArgumentError("no general.architecture string: not a model file");
  }
  if (std::find(kArchitectures.begin(), kArchitectures.end(), *arch) == kArchitectures.end()) {
    return absl::InvalidArgumentError(absl::StrCat("architecture '", *arch,
                                                   "' is not supported (heavykv runs ",
                                                   absl::StrJoin(kArchitectures, ", "), ")"));
  }
  if (file.tensors().empty()) {
    return absl::InvalidArgumentError("the file has no tensors (a vocabulary-only file?)");
  }
  for (const GgufTensor& t : file.tensors()) {
    if (std::find(kTypes.begin(), kTypes.end(), t.type) == kTypes.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "' has type ", GgmlTypeName(t.type), " (heavykv runs ",
          absl::StrJoin(
              kTypes, ", ",
              [](std::string* out, GgmlType x) { absl::StrAppend(out, GgmlTypeName(x)); }),
          ")"));
    }
  }
  absl::StatusOr<ModelConfig> config = ReadGgufModelConfig(file);
  if (config.ok()) return absl::OkStatus();
  // Without the file name, which the loader's messages start with.
  absl::string_view message = config.status().message();
  absl::ConsumePrefix(&message, absl::StrCat(file.path(), ": "));
  return absl::Status(config.status().code(), message);
}

}  // namespace heavykv
