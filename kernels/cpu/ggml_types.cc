#include "kernels/cpu/ggml_types.h"

#include <array>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace heavykv {
namespace {

// Block layouts from the GGUF specification (ggml's docs/gguf.md and ggml-common.h's block
// structs): a 32-element block of Q4_0 is an fp16 scale and 16 bytes of nibbles (18 bytes); a
// 256-element K-quant super-block holds its scales and quants (Q4_K: 2 + 2 + 12 + 128 = 144).
constexpr std::array<GgmlTypeInfo, 20> kTypes = {{
    {GgmlType::kF32, "F32", 1, 4},       {GgmlType::kF16, "F16", 1, 2},
    {GgmlType::kQ4_0, "Q4_0", 32, 18},   {GgmlType::kQ4_1, "Q4_1", 32, 20},
    {GgmlType::kQ5_0, "Q5_0", 32, 22},   {GgmlType::kQ5_1, "Q5_1", 32, 24},
    {GgmlType::kQ8_0, "Q8_0", 32, 34},   {GgmlType::kQ8_1, "Q8_1", 32, 36},
    {GgmlType::kQ2_K, "Q2_K", 256, 84},  {GgmlType::kQ3_K, "Q3_K", 256, 110},
    {GgmlType::kQ4_K, "Q4_K", 256, 144}, {GgmlType::kQ5_K, "Q5_K", 256, 176},
    {GgmlType::kQ6_K, "Q6_K", 256, 210}, {GgmlType::kQ8_K, "Q8_K", 256, 292},
    {GgmlType::kI8, "I8", 1, 1},         {GgmlType::kI16, "I16", 1, 2},
    {GgmlType::kI32, "I32", 1, 4},       {GgmlType::kI64, "I64", 1, 8},
    {GgmlType::kF64, "F64", 1, 8},       {GgmlType::kBF16, "BF16", 1, 2},
}};

}  // namespace

std::span<const GgmlTypeInfo> AllGgmlTypes() { return kTypes; }

std::optional<GgmlType> GgmlTypeFromId(uint32_t id) {
  for (const GgmlTypeInfo& t : kTypes) {
    if (static_cast<uint32_t>(t.type) == id) return t.type;
  }
  return std::nullopt;
}

std::optional<GgmlType> GgmlTypeFromName(absl::string_view name) {
  for (const GgmlTypeInfo& t : kTypes) {
    if (absl::EqualsIgnoreCase(t.name, name)) return t.type;
  }
  return std::nullopt;
}

const GgmlTypeInfo& GgmlTypeInfoOf(GgmlType type) {
  for (const GgmlTypeInfo& t : kTypes) {
    if (t.type == type) return t;
  }
  std::abort();  // a GgmlType value outside the enumerators is a broken invariant
}

absl::StatusOr<int64_t> GgmlTensorBytes(GgmlType type, std::span<const int64_t> dims) {
  const GgmlTypeInfo& info = GgmlTypeInfoOf(type);
  if (dims.empty()) return absl::InvalidArgumentError("a tensor needs at least one dimension");
  int64_t elements = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("dimension ", i, " is ", dims[i], ", not positive"));
    }
    if (__builtin_mul_overflow(elements, dims[i], &elements)) {
      return absl::InvalidArgumentError("the element count overflows int64");
    }
  }
  if (dims[0] % info.block_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("row length ", dims[0], " is not a multiple of ",
                                                   info.name, "'s block size ", info.block_size));
  }
  int64_t bytes;
  if (__builtin_mul_overflow(elements / info.block_size, info.block_bytes, &bytes)) {
    return absl::InvalidArgumentError("the byte size overflows int64");
  }
  return bytes;
}

}  // namespace heavykv
