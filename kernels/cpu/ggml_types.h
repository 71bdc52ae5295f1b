// The ggml tensor types a GGUF file can hold: their ids (as stored in the file), names and the
// block layout that gives a tensor's size in bytes. A row of `n` elements of a type with block
// size B and B-element blocks of `block_bytes` takes n / B * block_bytes bytes; n must be a
// multiple of B (a K-quant row is a whole number of 256-element super-blocks).
//
// Only the types below are known; a file with any other type id is refused by GgufFile::Open
// (the IQ* and ternary types have no kernels here, and their ids are refused with the id named).
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace heavykv {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
};

struct GgmlTypeInfo {
  GgmlType type;
  absl::string_view name;  // as llama.cpp prints it: "F32", "Q4_K", "BF16"
  int64_t block_size;      // elements per block
  int64_t block_bytes;     // bytes per block
};

// Every known type, in id order.
std::span<const GgmlTypeInfo> AllGgmlTypes();
// The type with this id, or nullopt when the id is not one of the known types.
std::optional<GgmlType> GgmlTypeFromId(uint32_t id);
// The type with this name (case-insensitive), or nullopt.
std::optional<GgmlType> GgmlTypeFromName(absl::string_view name);
const GgmlTypeInfo& GgmlTypeInfoOf(GgmlType type);
inline absl::string_view GgmlTypeName(GgmlType type) { return GgmlTypeInfoOf(type).name; }

// Bytes of a tensor of `type` with these dimensions (dims[0] is the row length, the fastest
// varying one). INVALID_ARGUMENT when a dimension is not positive, the row length is not a
// multiple of the block size, or the element or byte count overflows int64.
absl::StatusOr<int64_t> GgmlTensorBytes(GgmlType type, std::span<const int64_t> dims);

}  // namespace heavykv
