#include "kernels/cpu/ggml_types.h"

#include <array>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace heavykv {
namespace {

inline constexpr size_t kNumIds = 31;  // ids 0..30 (BF16 is the largest known)

// Position in kGgmlTypes of each id, -1 for an unknown one.
constexpr std::array<int8_t, kNumIds> kIndexOfId = [] {
  std::array<int8_t, kNumIds> index{};
  index.fill(-1);
  for (size_t i = 0; i < std::size(kGgmlTypes); ++i) {
    index[static_cast<uint32_t>(kGgmlTypes[i].type)] = static_cast<int8_t>(i);
  }
  return index;
}();

}  // namespace

std::span<const GgmlTypeInfo> AllGgmlTypes() { return kGgmlTypes; }

std::optional<GgmlType> GgmlTypeFromId(uint32_t id) {
  if (id >= kNumIds || kIndexOfId[id] < 0) return std::nullopt;
  return kGgmlTypes[kIndexOfId[id]].type;
}

std::optional<GgmlType> GgmlTypeFromName(absl::string_view name) {
  for (const GgmlTypeInfo& t : kGgmlTypes) {
    if (absl::EqualsIgnoreCase(t.name, name)) return t.type;
  }
  return std::nullopt;
}

const GgmlTypeInfo& GgmlTypeInfoOf(GgmlType type) {
  const uint32_t id = static_cast<uint32_t>(type);
  if (id >= kNumIds || kIndexOfId[id] < 0) std::abort();  // not an enumerator: broken invariant
  return kGgmlTypes[kIndexOfId[id]];
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
