// Linear::Multiply (linear.h), apart from the rest of Linear so that code that only holds and
// reads weights (the CUDA module, which uploads them) does not link the CPU GEMMs.
#include "kernels/cpu/linear.h"
#include "kernels/cpu/packed_gemm.h"
#include "kernels/cpu/quant_gemm.h"

namespace heavykv::cpu {

void Linear::Multiply(const float* x, float* y, int64_t m, int64_t ldy, bool accumulate) const {
  for (const Part& p : parts_) {
    if (const auto* w = std::get_if<PackedMatrix>(&p)) {
      MatmulPacked(x, *w, y, m, ldy, accumulate);
    } else {
      MatmulQuant(x, std::get<QuantMatrix>(p), y, m, ldy, accumulate);
    }
    y += PartRows(p);
  }
}

bool Linear::TeamCapable(int64_t m) const {
  for (const Part& p : parts_) {
    const auto* q = std::get_if<QuantMatrix>(&p);
    if (q == nullptr || !QuantUsesInt8(q->type(), m)) return false;
  }
  return !parts_.empty();
}

void Linear::MultiplyTeam(const float* x, float* y, int64_t m, int64_t ldy,
                          bool accumulate) const {
  for (const Part& p : parts_) {
    MatmulQuantTeam(x, std::get<QuantMatrix>(p), y, m, ldy, accumulate);
    y += PartRows(p);
  }
}

}  // namespace heavykv::cpu
