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
//
// A file too large to hold in memory streams: declare each tensor with AddTensorInfo (the header
// needs only names, types and shapes), then StartFile writes the header and returns a
// GgufStreamWriter that takes the tensors' bytes in order:
//
//   w.AddTensorInfo("token_embd.weight", GgmlType::kQ4_K, {4096, 128256});
//   absl::StatusOr<GgufStreamWriter> out = w.StartFile("model.gguf");
//   while (...) s = out->Write(chunk.data(), chunk.size());   // row chunks, any split
//   s = out->Finish();
#pragma once

#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/gguf/gguf.h"
#include "kernels/cpu/ggml_types.h"

namespace heavykv {

class GgufStreamWriter;

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
  // An entry read from another file (GgufFile::metadata()), copied as it is: same key, type and
  // value.
  void AddMetadata(const GgufMetadata& m);

  // A tensor of `type` with dims (dims[0] the row length, 1..4 of them) and its bytes.
  // INVALID_ARGUMENT when the shape is invalid for the type or `data` has the wrong size.
  absl::Status AddTensor(absl::string_view name, GgmlType type, std::vector<int64_t> dims,
                         std::string data);
  // A tensor whose bytes come later, through StartFile's stream; same checks as AddTensor.
  absl::Status AddTensorInfo(absl::string_view name, GgmlType type, std::vector<int64_t> dims);

  // The whole file. Serialize writes zeros for a tensor added without bytes; WriteFile writes it
  // to `path` (INVALID_ARGUMENT naming the path on failure, FAILED_PRECONDITION when a tensor
  // was added without bytes).
  std::string Serialize() const;
  absl::Status WriteFile(const std::string& path) const;
  // Creates `path`, writes everything before the tensor data and returns the stream that writes
  // the rest (INVALID_ARGUMENT naming the path when it cannot be created). This writer must
  // outlive the stream and not change while it is open.
  absl::StatusOr<GgufStreamWriter> StartFile(const std::string& path) const;

 private:
  friend class GgufStreamWriter;
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> dims;
    std::string data;
    uint64_t offset;
    uint64_t bytes;  // == data.size() unless the bytes are streamed (has_data false)
    bool has_data;
  };
  void Key(absl::string_view key, GgufValueType type);
  absl::Status PushTensor(absl::string_view name, GgmlType type, std::vector<int64_t> dims,
                          std::string data, bool has_data);
  std::string Header() const;

  uint64_t alignment_;
  uint32_t version_ = 3;
  uint64_t num_metadata_ = 0;
  std::string metadata_;  // serialized metadata entries
  std::vector<Tensor> tensors_;
  uint64_t data_bytes_ = 0;  // the data section so far, padded
};

// The data section of a file that GgufWriter::StartFile began: tensors in the order they were
// added; those added with bytes it writes itself, those added with AddTensorInfo take exactly
// their size through Write, in as many pieces as the caller likes (a piece never crosses into
// the next tensor). Alignment padding goes between tensors unasked.
class GgufStreamWriter {
 public:
  GgufStreamWriter(GgufStreamWriter&&) = default;
  GgufStreamWriter& operator=(GgufStreamWriter&&) = default;
  ~GgufStreamWriter();  // closes the file (an unfinished file is left as written so far)

  // The streamed tensor the next Write belongs to; nullptr once every tensor is written.
  const std::string* current_tensor() const;
  // INVALID_ARGUMENT when `n` runs past the current tensor's end or no tensor is left;
  // DATA_LOSS when the disk write fails.
  absl::Status Write(const void* data, size_t n);
  // FAILED_PRECONDITION naming the first tensor not fully written; DATA_LOSS when the flush or
  // close fails.
  absl::Status Finish();

 private:
  friend class GgufWriter;
  struct Closer {
    void operator()(std::FILE* f) const;
  };
  GgufStreamWriter(const GgufWriter* writer, std::FILE* f, std::string path);
  // Finishes the current tensor's padding and writes stored tensors until a streamed one.
  bool Advance();

  const GgufWriter* writer_;
  std::unique_ptr<std::FILE, Closer> file_;
  std::string path_;
  size_t next_ = 0;          // index of the tensor being written
  uint64_t written_ = 0;     // bytes of it written so far
  bool ok_ = true;
};

}  // namespace heavykv
