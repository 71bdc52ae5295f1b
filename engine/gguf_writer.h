// GgufWriter: builds a GGUF v3 file from metadata and tensors (raw bytes with a ggml type), with
// the data section and every tensor aligned to `alignment` (written as general.alignment when it
// is not the default 32). Used by the tests to make valid and broken files, and by
// make-model --format gguf.
//
//   GgufWriter w;
//   w.AddString("general.architecture", "llama");
//   w.AddU32("llama.context_length", 512);
//   absl::Status s = w.AddTensor("token_embd.weight", GgmlType::kF32, {64, 512}, bytes);
//   if (s.ok()) s = w.WriteFile("model.gguf");
//
// The writer writes what it is given, in order: it does not check keys (a repeated key is written
// twice, which a reader refuses), only that each tensor's bytes match its type and shape.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/gguf.h"
#include "engine/gguf_types.h"

namespace heavykv {

class GgufWriter {
 public:
  explicit GgufWriter(uint64_t alignment = 32);

  // Header fields, for tests that need other values (a reader refuses versions other than 2, 3).
  void set_version(uint32_t version) { version_ = version; }

  void AddU8(absl::string_view key, uint8_t v);
  void AddI8(absl::string_view key, int8_t v);
  void AddU16(absl::string_view key, uint16_t v);
  void AddI16(absl::string_view key, int16_t v);
  void AddU32(absl::string_view key, uint32_t v);
  void AddI32(absl::string_view key, int32_t v);
  void AddU64(absl::string_view key, uint64_t v);
  void AddI64(absl::string_view key, int64_t v);
  void AddF32(absl::string_view key, float v);
  void AddF64(absl::string_view key, double v);
  void AddBool(absl::string_view key, bool v);
  void AddString(absl::string_view key, absl::string_view v);
  // An array of `count` scalars of `element_type` (not string or array) whose little-endian
  // bytes are `elements` (count * the element's size).
  void AddArray(absl::string_view key, GgufValueType element_type, uint64_t count,
                absl::string_view elements);
  void AddArrayI32(absl::string_view key, const std::vector<int32_t>& v);
  void AddArrayF32(absl::string_view key, const std::vector<float>& v);
  void AddArrayString(absl::string_view key, const std::vector<std::string>& v);

  // A tensor of `type` with dims (dims[0] the row length, 1..4 of them) and its bytes.
  // INVALID_ARGUMENT when the shape is invalid for the type or `data` has the wrong size.
  absl::Status AddTensor(absl::string_view name, GgmlType type, std::vector<int64_t> dims,
                         std::string data);

  // The whole file. WriteFile writes it to `path` (INVALID_ARGUMENT naming the path on failure).
  std::string Serialize() const;
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> dims;
    std::string data;
    uint64_t offset;
  };
  void Key(absl::string_view key, GgufValueType type);
  std::string Header() const;

  uint64_t alignment_;
  uint32_t version_ = 3;
  uint64_t num_metadata_ = 0;
  std::string metadata_;  // serialized metadata entries
  std::vector<Tensor> tensors_;
  uint64_t data_bytes_ = 0;  // the data section so far, padded
};

}  // namespace heavykv
