#include "kernels/cpu/packed_matrix.h"

#include <cstring>
#include <new>

namespace heavykv::cpu {

PackedMatrix PackedMatrix::FromRowMajor(const float* w, int64_t n, int64_t k) {
  PackedMatrix m;
  m.n_ = n;
  m.k_ = k;
  const int64_t floats = m.num_panels() * k * kPanelRows;
  m.data_.assign(floats, 0.0f);  // the padding rows of the last panel stay zero
  float* p = m.data_.data();
  for (int64_t r = 0; r < n; ++r) {
    float* dst = p + (r / kPanelRows) * k * kPanelRows + r % kPanelRows;
    const float* src = w + r * k;
    for (int64_t kk = 0; kk < k; ++kk) dst[kk * kPanelRows] = src[kk];
  }
  return m;
}

void PackedMatrix::Row(int64_t r, float* out) const {
  const float* src = data_.data() + (r / kPanelRows) * k_ * kPanelRows + r % kPanelRows;
  for (int64_t kk = 0; kk < k_; ++kk) out[kk] = src[kk * kPanelRows];
}

void PackedMatrix::ToRowMajor(float* out) const {
  for (int64_t r = 0; r < n_; ++r) Row(r, out + r * k_);
}

}  // namespace heavykv::cpu
