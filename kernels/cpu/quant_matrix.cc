#include "kernels/cpu/quant_matrix.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace heavykv::cpu {

absl::Status QuantMatrix::CheckShape(QuantType type, int64_t n, int64_t k) {
  if (n <= 0 || k <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a ", QuantTypeName(type), " matrix needs positive rows and columns, got ", n, " x ", k));
  }
  const int64_t block = QuantBlockElems(type);
  if (k % block != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a ", QuantTypeName(type), " row holds whole blocks of ", block,
                     " elements, but the matrix has ", k, " columns (", n, " x ", k, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<QuantMatrix> QuantMatrix::Empty(QuantType type, int64_t n, int64_t k,
                                               int64_t bytes) {
  if (absl::Status s = CheckShape(type, n, k); !s.ok()) return s;
  const int64_t row_bytes = QuantRowBytes(type, k);
  if (bytes != n * row_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("a ", n, " x ", k, " ", QuantTypeName(type),
                                                   " matrix is ", n * row_bytes, " bytes, but ",
                                                   bytes, " were given"));
  }
  QuantMatrix m;
  m.type_ = type;
  m.n_ = n;
  m.k_ = k;
  m.row_bytes_ = row_bytes;
  return m;
}

absl::StatusOr<QuantMatrix> QuantMatrix::FromRows(QuantType type, int64_t n, int64_t k,
                                                  const void* data, int64_t bytes) {
  absl::StatusOr<QuantMatrix> m = Empty(type, n, k, bytes);
  if (!m.ok()) return m;
  m->data_.resize(bytes);
  std::memcpy(m->data_.data(), data, bytes);
  return m;
}

absl::StatusOr<QuantMatrix> QuantMatrix::View(QuantType type, int64_t n, int64_t k,
                                              const void* data, int64_t bytes,
                                              std::shared_ptr<const void> owner) {
  absl::StatusOr<QuantMatrix> m = Empty(type, n, k, bytes);
  if (!m.ok()) return m;
  m->view_ = static_cast<const uint8_t*>(data);
  m->owner_ = std::move(owner);
  return m;
}

absl::StatusOr<QuantMatrix> QuantMatrix::Quantize(QuantType type, const float* w, int64_t n,
                                                  int64_t k) {
  if (absl::Status s = CheckShape(type, n, k); !s.ok()) return s;
  QuantMatrix m;
  m.type_ = type;
  m.n_ = n;
  m.k_ = k;
  m.row_bytes_ = QuantRowBytes(type, k);
  m.data_.resize(n * m.row_bytes_);
  for (int64_t r = 0; r < n; ++r)
    QuantizeRow(type, w + r * k, m.data_.data() + r * m.row_bytes_, k);
  return m;
}

std::optional<QuantMatrix> QuantMatrix::JoinViews(const QuantMatrix& a, const QuantMatrix& b) {
  if (!a.is_view() || !b.is_view() || a.type_ != b.type_ || a.k_ != b.k_ ||
      a.view_ + a.bytes() != b.view_) {
    return std::nullopt;
  }
  QuantMatrix m = a;
  m.n_ = a.n_ + b.n_;
  return m;
}

absl::StatusOr<QuantMatrix> QuantMatrix::Concat(const QuantMatrix& a, const QuantMatrix& b) {
  if (a.type_ != b.type_ || a.k_ != b.k_ || a.empty() || b.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot stack a ", b.n_, " x ", b.k_, " ", QuantTypeName(b.type_), " matrix below a ",
        a.n_, " x ", a.k_, " ", QuantTypeName(a.type_), " one"));
  }
  absl::StatusOr<QuantMatrix> m = Empty(a.type_, a.n_ + b.n_, a.k_, a.bytes() + b.bytes());
  if (!m.ok()) return m;
  m->data_.resize(a.bytes() + b.bytes());
  std::memcpy(m->data_.data(), a.data(), a.bytes());
  std::memcpy(m->data_.data() + a.bytes(), b.data(), b.bytes());
  return m;
}

void QuantMatrix::DequantizeRowTo(int64_t r, float* out) const {
  DequantizeRow(type_, row(r), out, k_);
}

}  // namespace heavykv::cpu
