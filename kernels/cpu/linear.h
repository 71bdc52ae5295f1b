// Linear: one weight matrix of the model, W[n][k] (y = x W^T), whatever its storage. The rows
// are one or more consecutive blocks ("parts"), each either a PackedMatrix (fp32 or bf16 panels,
// packed_matrix.h) or a QuantMatrix (a GGUF block format kept as the file stores it,
// quant_matrix.h). Fused projections are built by appending parts: wq | wk | wv of a GGUF file
// may have different types (Q4_K_M stores attn_v as Q6_K in some layers). A QuantMatrix part
// absorbs a following QuantMatrix of the same type and width: by copying both when they own
// their bytes, and, when they are views of a file's mapping, only where the second starts where
// the first ends (never a copy: otherwise the part is simply added).
//
// Multiply() is the weight-type dispatch of the CPU forward pass: each part goes to its kernel
// (MatmulPacked or MatmulQuant) with its block of output columns. Immutable once built; any
// number of threads may read it.
#pragma once

#include <cstdint>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cpu/packed_matrix.h"
#include "kernels/cpu/quant_matrix.h"

namespace heavykv::cpu {

class Linear {
 public:
  using Part = std::variant<PackedMatrix, QuantMatrix>;

  Linear() = default;
  explicit Linear(PackedMatrix m) { parts_.emplace_back(std::move(m)); }
  explicit Linear(QuantMatrix m) { parts_.emplace_back(std::move(m)); }

  // Appends rows below the current ones. InvalidArgument when the part's width differs.
  absl::Status Append(PackedMatrix m);
  absl::Status Append(QuantMatrix m);

  int64_t rows() const;  // n: outputs, summed over the parts
  int64_t cols() const;  // k: inputs
  bool empty() const { return parts_.empty(); }
  const std::vector<Part>& parts() const { return parts_; }
  // True when every part is an fp32 or bf16 PackedMatrix of that type.
  bool IsPacked(WeightType type) const;
  // Bytes one pass of the GEMM streams (the parts' bytes, padding panels excluded: rows x cols x
  // element size for packed parts, the block bytes for quantized ones).
  int64_t bytes() const;

  // out[k] = W[r][:] (dequantized where quantized).
  void Row(int64_t r, float* out) const;
  // out[n][k] = W.
  void ToRowMajor(float* out) const;

  // y[m][ldy] (+)= x[m][k] * W^T, ldy >= rows().
  void Multiply(const float* x, float* y, int64_t m, int64_t ldy, bool accumulate) const;

  // Whether MultiplyTeam serves this matrix at batch m: every part is a block format that
  // MatmulQuant multiplies on its int8 path.
  bool TeamCapable(int64_t m) const;
  // Multiply, called by every thread of an enclosing OpenMP parallel region (MatmulQuantTeam for
  // each part); no barrier at the end. Requires TeamCapable(m).
  void MultiplyTeam(const float* x, float* y, int64_t m, int64_t ldy, bool accumulate) const;

 private:
  static int64_t PartRows(const Part& p);
  // InvalidArgument unless a part of `cols` columns may go below the current ones.
  absl::Status CheckWidth(int64_t cols) const;

  std::vector<Part> parts_;
};

}  // namespace heavykv::cpu
