// GgufFile: a GGUF file (v2 or v3), memory-mapped read-only and validated, with typed access to
// its metadata and views of its tensors' bytes. docs/ARCHITECTURE.md "GGUF files" states the
// contract; in short:
//
//   absl::StatusOr<GgufFile> f = GgufFile::Open("model.gguf");
//   if (!f.ok()) return f.status();                 // NOT_FOUND or INVALID_ARGUMENT, one line
//   absl::StatusOr<uint32_t> ctx = f->GetU32("llama.context_length");
//   const GgufTensor* wq = f->FindTensor("blk.0.attn_q.weight");  // nullptr when absent
//   std::span<const uint8_t> bytes = wq->data;      // points into the mapping
//
// Open validates everything it reads against the file size, overflow-safe, before use, and never
// reads tensor data. Every view (string_view, span, GgufTensor*, GgufMetadata*) points into the
// mapping or this object and lives as long as the GgufFile; moving the GgufFile keeps them valid.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/cpu/ggml_types.h"

namespace heavykv {

// Metadata value types, with their ids in the file.
enum class GgufValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
// "u8", "i32", "f32", "bool", "string", "array", ...
absl::string_view GgufValueTypeName(GgufValueType type);
bool IsGgufIntegerType(GgufValueType type);
// Bytes of one scalar of `type` (1, 2, 4 or 8); 0 for strings and arrays (variable length).
uint64_t GgufScalarBytes(GgufValueType type);

// One scalar: an integer (unsigned types as uint64_t, signed as int64_t), a float (float32 and
// float64 as double), a bool or a string.
using GgufScalar = std::variant<uint64_t, int64_t, double, bool, absl::string_view>;

// One metadata key and its value. For a scalar, `type` is its type; for an array, `type` is
// kArray and `element_type` / `count` describe the elements. `raw` is the value's bytes in the
// mapping: the scalar, the string's characters, or the array's elements (after its element type
// and count), all already validated.
struct GgufMetadata {
  absl::string_view key;
  GgufValueType type = GgufValueType::kU8;
  GgufValueType element_type = GgufValueType::kU8;  // arrays only
  uint64_t count = 0;                               // arrays only
  std::span<const uint8_t> raw;

  bool is_array() const { return type == GgufValueType::kArray; }
  // The scalar's value; for an array, its element i (0 <= i < count; O(i) for strings).
  GgufScalar Value() const;
  GgufScalar Element(uint64_t i) const;
};

struct GgufTensor {
  absl::string_view name;
  GgmlType type = GgmlType::kF32;
  int32_t num_dims = 0;
  std::array<int64_t, 4> dims = {1, 1, 1, 1};  // dims[0] is the row length; unused ones are 1
  int64_t num_elements = 0;
  uint64_t offset = 0;            // from the start of the data section, aligned
  std::span<const uint8_t> data;  // the tensor's bytes in the mapping (type and dims give size)

  std::span<const int64_t> shape() const { return {dims.data(), size_t(num_dims)}; }
};

class GgufFile {
 public:
  // Maps and validates `path`. NOT_FOUND when it cannot be opened; INVALID_ARGUMENT naming the
  // file, the key or tensor, and what is wrong, for anything else.
  static absl::StatusOr<GgufFile> Open(const std::string& path);

  GgufFile(GgufFile&& other) noexcept;
  GgufFile& operator=(GgufFile&& other) noexcept;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  ~GgufFile();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t file_size() const { return size_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // start of the data section

  // Metadata in file order, and lookup by key (nullptr when absent).
  const std::vector<GgufMetadata>& metadata() const { return metadata_; }
  const GgufMetadata* FindMetadata(absl::string_view key) const;

  // Typed lookups: INVALID_ARGUMENT "<file>: metadata key 'k' is missing" or "... is a <type>,
  // not a <wanted>". Integer getters take any integer type whose value fits the result.
  absl::StatusOr<uint32_t> GetU32(absl::string_view key) const;
  absl::StatusOr<int32_t> GetI32(absl::string_view key) const;
  absl::StatusOr<uint64_t> GetU64(absl::string_view key) const;
  absl::StatusOr<int64_t> GetI64(absl::string_view key) const;
  absl::StatusOr<float> GetF32(absl::string_view key) const;   // float32 only
  absl::StatusOr<double> GetF64(absl::string_view key) const;  // float32 or float64
  absl::StatusOr<bool> GetBool(absl::string_view key) const;
  absl::StatusOr<absl::string_view> GetString(absl::string_view key) const;
  // Arrays: the key must hold an array of the right element type (any integer type for
  // GetArrayI64, each element fitting int64; float32 for GetArrayF32; strings).
  absl::StatusOr<std::vector<int64_t>> GetArrayI64(absl::string_view key) const;
  absl::StatusOr<std::vector<float>> GetArrayF32(absl::string_view key) const;
  absl::StatusOr<std::vector<absl::string_view>> GetArrayString(absl::string_view key) const;

  // Tensors in file order, and lookup by name (nullptr when absent).
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* FindTensor(absl::string_view name) const;

 private:
  GgufFile() = default;
  friend class GgufParser;
  absl::StatusOr<const GgufMetadata*> Require(absl::string_view key) const;
  absl::Status WrongType(const GgufMetadata& m, absl::string_view wanted) const;
  void Unmap();

  std::string path_;
  const uint8_t* map_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<GgufMetadata> metadata_;
  std::vector<GgufTensor> tensors_;
  absl::flat_hash_map<absl::string_view, size_t> metadata_index_, tensor_index_;
};

// True when `path` starts with the GGUF magic ("GGUF"); false when it does not or cannot be read.
bool IsGgufFile(const std::string& path);

}  // namespace heavykv
