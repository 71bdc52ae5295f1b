// The ggml tensor types, the one table of their ids (as stored in a GGUF file), names and the
// block layout that gives a tensor's size in bytes. It sits on the kernels floor, the lowest that
// needs it: the CPU kernels' QuantType (quant_types.h) is this enum, limited to the types they
// have kernels for, and the GGUF reader and writer (engine/gguf/) use it for every tensor.
// A row of `n` elements of a type with block size B and B-element blocks of `block_bytes` takes
// n / B * block_bytes bytes; n must be a multiple of B (a K-quant row is a whole number of
// 256-element super-blocks).
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
  const char* ggml_name;   // as ggml_type_name gives it: "f32", "q4_K", "bf16"
  int64_t block_size;      // elements per block
  int64_t block_bytes;     // bytes per block
};

// Every known type, in id order. Block layouts from the GGUF specification (ggml's docs/gguf.md
// and ggml-common.h's block structs): a 32-element block of Q4_0 is an fp16 scale and 16 bytes of
// nibbles (18 bytes); a 256-element K-quant super-block holds its scales and quants (Q4_K:
// 2 + 2 + 12 + 128 = 144).
inline constexpr GgmlTypeInfo kGgmlTypes[] = {
    {GgmlType::kF32, "F32", "f32", 1, 4},         {GgmlType::kF16, "F16", "f16", 1, 2},
    {GgmlType::kQ4_0, "Q4_0", "q4_0", 32, 18},    {GgmlType::kQ4_1, "Q4_1", "q4_1", 32, 20},
    {GgmlType::kQ5_0, "Q5_0", "q5_0", 32, 22},    {GgmlType::kQ5_1, "Q5_1", "q5_1", 32, 24},
    {GgmlType::kQ8_0, "Q8_0", "q8_0", 32, 34},    {GgmlType::kQ8_1, "Q8_1", "q8_1", 32, 36},
    {GgmlType::kQ2_K, "Q2_K", "q2_K", 256, 84},   {GgmlType::kQ3_K, "Q3_K", "q3_K", 256, 110},
    {GgmlType::kQ4_K, "Q4_K", "q4_K", 256, 144},  {GgmlType::kQ5_K, "Q5_K", "q5_K", 256, 176},
    {GgmlType::kQ6_K, "Q6_K", "q6_K", 256, 210},  {GgmlType::kQ8_K, "Q8_K", "q8_K", 256, 292},
    {GgmlType::kI8, "I8", "i8", 1, 1},            {GgmlType::kI16, "I16", "i16", 1, 2},
    {GgmlType::kI32, "I32", "i32", 1, 4},         {GgmlType::kI64, "I64", "i64", 1, 8},
    {GgmlType::kF64, "F64", "f64", 1, 8},         {GgmlType::kBF16, "BF16", "bf16", 1, 2},
};

std::span<const GgmlTypeInfo> AllGgmlTypes();
// The type with this id, or nullopt when the id is not one of the known types.
std::optional<GgmlType> GgmlTypeFromId(uint32_t id);
// The type with this name (case-insensitive), or nullopt.
std::optional<GgmlType> GgmlTypeFromName(absl::string_view name);
// The entry of `type` (an enumerator: anything else is a broken invariant and aborts). Constant
// time, for the kernels' per-row block arithmetic.
const GgmlTypeInfo& GgmlTypeInfoOf(GgmlType type);
inline absl::string_view GgmlTypeName(GgmlType type) { return GgmlTypeInfoOf(type).name; }

// Bytes of a tensor of `type` with these dimensions (dims[0] is the row length, the fastest
// varying one). INVALID_ARGUMENT when a dimension is not positive, the row length is not a
// multiple of the block size, or the element or byte count overflows int64.
absl::StatusOr<int64_t> GgmlTensorBytes(GgmlType type, std::span<const int64_t> dims);

}  // namespace heavykv
