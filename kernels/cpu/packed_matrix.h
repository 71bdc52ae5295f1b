// PackedMatrix: a weight matrix W[n][k] (y = x W^T, n outputs of k inputs) stored in the layout
// the CPU GEMM kernel (packed_gemm.h) streams: panels of kPanelRows rows of W, each panel
// k-major, so one 64-byte load holds 16 consecutive outputs of one input:
//   data[p][kk][j] = W[p * kPanelRows + j][kk]          // [ceil(n / 48)][k][48], zero padded
// A decode step then reads every weight exactly once, in address order, with no packing pass
// (BLAS packs W into a buffer on every call). The model is packed once at load time; nothing
// else holds the row-major copy, so Row() and ToRowMajor() read the packed data back. The panels
// live in an AlignedVector (kernels/aligned_vector.h, header only): large matrices sit on 2 MiB
// transparent huge pages where the kernel grants them, so the weight stream does not take a TLB
// miss (a nested page walk in a VM) every 4 KiB; measured ~4% on the batch-32 step's GEMMs.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>

#include "kernels/aligned_vector.h"

namespace heavykv::cpu {

inline constexpr int64_t kPanelRows = 48;  // three AVX-512 vectors of outputs per panel

// Element type of the packed weights: fp32, or bf16 (the upper half of the fp32, rounded to
// nearest even): half the bytes to hold and to stream, widened back to fp32 by the GEMM, whose
// arithmetic stays fp32.
//
// bf16 panels pair consecutive inputs: 32-bit word [p][kk / 2][j] holds W[row][kk] in its high
// half and W[row][kk + 1] in its low half (k padded to even with zeros), so that one 64-byte load
// gives 16 outputs of two inputs, and each becomes an fp32 vector with one AND (the high half)
// or one shift (the low half) instead of a widening shuffle and a shift.
enum class WeightType { kFp32, kBf16 };

class PackedMatrix {
 public:
  PackedMatrix() = default;
  // Packs w[n][k] (row-major), rounding to bf16 when `type` is kBf16.
  static PackedMatrix FromRowMajor(const float* w, int64_t n, int64_t k,
                                   WeightType type = WeightType::kFp32);

  int64_t rows() const { return n_; }  // n: outputs
  int64_t cols() const { return k_; }  // k: inputs
  bool empty() const { return n_ == 0; }
  int64_t num_panels() const { return (n_ + kPanelRows - 1) / kPanelRows; }
  // Elements (fp32 or bf16) of one panel: k (bf16: k rounded up to even) x kPanelRows.
  int64_t panel_elems() const { return (bf16() ? (k_ + 1) / 2 * 2 : k_) * kPanelRows; }
  // Index, within its panel, of the element for input kk and panel row j.
  static int64_t IndexInPanel(int64_t kk, int64_t j, bool bf16) {
    return bf16 ? (kk / 2) * 2 * kPanelRows + 2 * j + (kk % 2 == 0 ? 1 : 0) : kk * kPanelRows + j;
  }
  WeightType type() const { return type_; }
  bool bf16() const { return type_ == WeightType::kBf16; }
  // [num_panels][panel_elems()], 64-byte aligned: fp32 (packed()) or bf16 (packed_bf16()).
  const float* packed() const { return data_.data(); }
  const uint16_t* packed_bf16() const { return reinterpret_cast<const uint16_t*>(data_.data()); }
  // Bytes of the panels (what one pass of the GEMM streams).
  int64_t bytes() const { return num_panels() * panel_elems() * (bf16() ? 2 : 4); }

  // out[k] = W[r][:].
  void Row(int64_t r, float* out) const;
  // out[n][k] = W.
  void ToRowMajor(float* out) const;

 private:
  int64_t n_ = 0, k_ = 0;
  WeightType type_ = WeightType::kFp32;
  AlignedVector<float> data_;  // bf16 panels use the first half
};

}  // namespace heavykv::cpu
