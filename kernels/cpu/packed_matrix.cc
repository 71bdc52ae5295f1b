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
  const bool bf16 = type == WeightType::kBf16;
  const int64_t elems = m.num_panels() * m.panel_elems();
  // Padding (rows past n in the last panel, bf16's odd last input) stays zero: 0.0f and bf16
  // zero are both all-zero bits.
  m.data_.assign(bf16 ? elems / 2 : elems, 0.0f);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t panel = (r / kPanelRows) * m.panel_elems(), j = r % kPanelRows;
    const float* src = w + r * k;
    if (bf16) {
      uint16_t* dst = reinterpret_cast<uint16_t*>(m.data_.data()) + panel;
      for (int64_t kk = 0; kk < k; ++kk) dst[IndexInPanel(kk, j, true)] = FloatToBf16(src[kk]);
    } else {
      float* dst = m.data_.data() + panel;
      for (int64_t kk = 0; kk < k; ++kk) dst[IndexInPanel(kk, j, false)] = src[kk];
    }
  }
  return m;
}

void PackedMatrix::Row(int64_t r, float* out) const {
  const int64_t panel = (r / kPanelRows) * panel_elems(), j = r % kPanelRows;
  if (bf16()) {
    const uint16_t* src = packed_bf16() + panel;
    for (int64_t kk = 0; kk < k_; ++kk) out[kk] = Bf16ToFloat(src[IndexInPanel(kk, j, true)]);
  } else {
    const float* src = data_.data() + panel;
    for (int64_t kk = 0; kk < k_; ++kk) out[kk] = src[IndexInPanel(kk, j, false)];
  }
}

void PackedMatrix::ToRowMajor(float* out) const {
  for (int64_t r = 0; r < n_; ++r) Row(r, out + r * k_);
}

}  // namespace heavykv::cpu
