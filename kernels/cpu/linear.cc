#include "kernels/cpu/linear.h"

#include "absl/strings/str_cat.h"

namespace heavykv::cpu {
int64_t Linear::PartRows(const Part& p) {
  return std::visit([](const auto& m) { return m.rows(); }, p);
}

absl::Status Linear::CheckWidth(int64_t part_cols) const {
  if (!parts_.empty() && part_cols != cols()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot append a part of ", part_cols,
                                                   " columns to a matrix of ", cols()));
  }
  return absl::OkStatus();
}

absl::Status Linear::Append(PackedMatrix m) {
  if (absl::Status s = CheckWidth(m.cols()); !s.ok()) return s;
  parts_.emplace_back(std::move(m));
  return absl::OkStatus();
}

absl::Status Linear::Append(QuantMatrix m) {
  if (absl::Status s = CheckWidth(m.cols()); !s.ok()) return s;
  if (!parts_.empty()) {
    if (auto* last = std::get_if<QuantMatrix>(&parts_.back());
        last != nullptr && last->type() == m.type()) {
      if (last->is_view() || m.is_view()) {  // join views only where they touch: never copy
        if (std::optional<QuantMatrix> joined = QuantMatrix::JoinViews(*last, m)) {
          *last = *std::move(joined);
          return absl::OkStatus();
        }
        parts_.emplace_back(std::move(m));
        return absl::OkStatus();
      }
      absl::StatusOr<QuantMatrix> merged = QuantMatrix::Concat(*last, m);
      if (!merged.ok()) return merged.status();
      *last = std::move(*merged);
      return absl::OkStatus();
    }
  }
  parts_.emplace_back(std::move(m));
  return absl::OkStatus();
}

int64_t Linear::rows() const {
  int64_t n = 0;
  for (const Part& p : parts_) n += PartRows(p);
  return n;
}

int64_t Linear::cols() const {
  return parts_.empty() ? 0 : std::visit([](const auto& m) { return m.cols(); }, parts_.front());
}

bool Linear::IsPacked(WeightType type) const {
  for (const Part& p : parts_) {
    const auto* m = std::get_if<PackedMatrix>(&p);
    if (m == nullptr || m->type() != type) return false;
  }
  return !parts_.empty();
}

int64_t Linear::bytes() const {
  int64_t b = 0;
  for (const Part& p : parts_) {
    if (const auto* m = std::get_if<PackedMatrix>(&p)) {
      b += m->rows() * m->cols() * (m->bf16() ? 2 : 4);
    } else {
      b += std::get<QuantMatrix>(p).bytes();
    }
  }
  return b;
}

void Linear::Row(int64_t r, float* out) const {
  for (const Part& p : parts_) {
    const int64_t n = PartRows(p);
    if (r < n) {
      if (const auto* m = std::get_if<PackedMatrix>(&p)) {
        m->Row(r, out);
      } else {
        std::get<QuantMatrix>(p).DequantizeRowTo(r, out);
      }
      return;
    }
    r -= n;
  }
}

void Linear::ToRowMajor(float* out) const {
  const int64_t k = cols();
  for (const Part& p : parts_) {
    if (const auto* m = std::get_if<PackedMatrix>(&p)) {
      m->ToRowMajor(out);
    } else {
      const QuantMatrix& q = std::get<QuantMatrix>(p);
      for (int64_t r = 0; r < q.rows(); ++r) q.DequantizeRowTo(r, out + r * k);
    }
    out += PartRows(p) * k;
  }
}

}  // namespace heavykv::cpu
