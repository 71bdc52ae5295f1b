#include "kernels/cpu/packed_matrix.h"

#include <cstring>
#include <new>

#include "kernels/bf16.h"

namespace heavykv::cpu {

PackedMatrix PackedMatrix::FromRowMajor(const float* w, int64_t n, int64_t k, WeightType type) {
  PackedMatrix m;
  m.n_ = n;
  m.k_ = k;
  m.type_ = type;
  const int64_t elems = m.num_panels() * k * kPanelRows;
  // The padding rows of the last panel stay zero (0.0f and bf16 0 are both all-zero bits).
  m.data_.assign(type == WeightType::kBf16 ? (elems + 1) / 2 : elems, 0.0f);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t first = (r / kPanelRows) * k * kPanelRows + r % kPanelRows;
    const float* src = w + r * k;
    if (type == WeightType::kBf16) {
      uint16_t* dst = reinterpret_cast<uint16_t*>(m.data_.data()) + first;
      for (int64_t kk = 0; kk < k; ++kk) dst[kk * kPanelRows] = FloatToBf16(src[kk]);
    } else {
      float* dst = m.data_.data() + first;
      for (int64_t kk = 0; kk < k; ++kk) dst[kk * kPanelRows] = src[kk];
    }
  }
  return m;
}

void PackedMatrix::Row(int64_t r, float* out) const {
  const int64_t first = (r / kPanelRows) * k_ * kPanelRows + r % kPanelRows;
  if (bf16()) {
    const uint16_t* src = packed_bf16() + first;
    for (int64_t kk = 0; kk < k_; ++kk) out[kk] = Bf16ToFloat(src[kk * kPanelRows]);
  } else {
    const float* src = data_.data() + first;
    for (int64_t kk = 0; kk < k_; ++kk) out[kk] = src[kk * kPanelRows];
  }
}

void PackedMatrix::ToRowMajor(float* out) const {
  for (int64_t r = 0; r < n_; ++r) Row(r, out + r * k_);
}

}  // namespace heavykv::cpu
