// QuantMatrix: a weight matrix W[n][k] (y = x W^T: n outputs of k inputs) of one QuantType,
// held as the GGUF file stores it: n rows of QuantRowBytes(type, k) bytes, each row k / block
// consecutive blocks (quant_types.h). No fp32 copy and no repacked layout: MatmulQuant
// (quant_gemm.h) reads the blocks directly, so resident bytes are the tensor's bytes. The bytes
// are either the matrix's own (FromRows, Quantize, Concat: 64-byte aligned, on huge pages when
// large, kernels/aligned_vector.h) or a view of memory another object owns (View: a GGUF file's
// read-only mapping, kept alive by the shared `owner`), so that loading a model copies nothing.
// Immutable once created; any number of threads may read it; copies share a view's owner.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "kernels/aligned_vector.h"
#include "kernels/cpu/quant_types.h"

namespace heavykv::cpu {

class QuantMatrix {
 public:
  QuantMatrix() = default;

  // Copies n rows of k elements of `type` from `data` ([n][row_bytes()], `bytes` long, e.g. a
  // GGUF tensor's data). InvalidArgument, saying which, when k is not a whole number of blocks,
  // n or k is not positive, or `bytes` is not n rows.
  static absl::StatusOr<QuantMatrix> FromRows(QuantType type, int64_t n, int64_t k,
                                              const void* data, int64_t bytes);
  // Quantizes w[n][k] (row-major fp32) with QuantizeRow; the same shape checks.
  static absl::StatusOr<QuantMatrix> Quantize(QuantType type, const float* w, int64_t n, int64_t k);
  // n rows of k elements of `type` at `data` (`bytes` long, the same checks as FromRows), not
  // copied: the matrix reads them in place, and holds `owner` (which must keep `data` valid and
  // unchanged) for as long as it or a copy lives. No alignment is required.
  static absl::StatusOr<QuantMatrix> View(QuantType type, int64_t n, int64_t k, const void* data,
                                          int64_t bytes, std::shared_ptr<const void> owner);
  // When `a` and `b` are views of the same type and width and b's rows start where a's end (two
  // tensors laid out back to back in a file), one view of both; else nullopt. Copies nothing.
  static std::optional<QuantMatrix> JoinViews(const QuantMatrix& a, const QuantMatrix& b);
  // The rows of `a`, then those of `b` (a fused projection). InvalidArgument unless both have the
  // same type and width.
  static absl::StatusOr<QuantMatrix> Concat(const QuantMatrix& a, const QuantMatrix& b);

  QuantType type() const { return type_; }
  int64_t rows() const { return n_; }  // n: outputs
  int64_t cols() const { return k_; }  // k: inputs
  bool empty() const { return n_ == 0; }
  int64_t row_bytes() const { return row_bytes_; }
  // Bytes of the rows (what one pass of the GEMM streams).
  int64_t bytes() const { return n_ * row_bytes_; }
  // Row r's blocks.
  const uint8_t* row(int64_t r) const { return data() + r * row_bytes_; }
  // True when the bytes are a view (View) rather than the matrix's own.
  bool is_view() const { return view_ != nullptr; }

  // out[k] = W[r][:], dequantized (portable code: the reference the kernels are tested against).
  void DequantizeRowTo(int64_t r, float* out) const;

 private:
  static absl::Status CheckShape(QuantType type, int64_t n, int64_t k);
  // A matrix of that shape with no bytes yet, once CheckShape passes and `bytes` is n rows.
  static absl::StatusOr<QuantMatrix> Empty(QuantType type, int64_t n, int64_t k, int64_t bytes);

  const uint8_t* data() const { return view_ != nullptr ? view_ : data_.data(); }

  QuantType type_ = QuantType::kF32;
  int64_t n_ = 0, k_ = 0, row_bytes_ = 0;
  AlignedVector<uint8_t> data_;   // [n][row_bytes_], when the matrix owns its bytes
  const uint8_t* view_ = nullptr;  // else [n][row_bytes_] held alive by owner_
  std::shared_ptr<const void> owner_;
};

}  // namespace heavykv::cpu
