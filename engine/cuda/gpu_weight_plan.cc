#include "engine/cuda/gpu_weight_plan.h"

#include <algorithm>
#include <variant>

#include "absl/strings/str_cat.h"

namespace heavykv {
namespace {

using cpu::QuantType;

int64_t AlignUp(int64_t v) { return (v + kGpuWeightAlign - 1) / kGpuWeightAlign * kGpuWeightAlign; }

bool IsFloatType(QuantType t) {
  return t == QuantType::kF32 || t == QuantType::kF16 || t == QuantType::kBF16;
}

class Planner {
 public:
  explicit Planner(GpuWeightPlan* plan) : plan_(plan) {}

  absl::Status Matrix(const cpu::Linear& m, const std::string& name, GpuMatrixPlan* out) {
    out->rows = m.rows();
    out->cols = m.cols();
    out->parts.clear();
    // A matrix with no block-format part has nothing to keep: the bf16 path's one part.
    const bool any_blocks = std::any_of(m.parts().begin(), m.parts().end(), [](const auto& p) {
      const auto* q = std::get_if<cpu::QuantMatrix>(&p);
      return q != nullptr && !IsFloatType(q->type());
    });
    if (plan_->mode == GpuWeights::kBf16 || !any_blocks) {
      WholeBf16(m, out);
      return absl::OkStatus();
    }
    int64_t row0 = 0;
    for (int i = 0; i < int(m.parts().size()); ++i) {
      const cpu::Linear::Part& p = m.parts()[i];
      GpuPart part;
      part.linear = &m;
      part.part_index = i;
      part.row0 = row0;
      part.cols = m.cols();
      if (const auto* q = std::get_if<cpu::QuantMatrix>(&p);
          q != nullptr && !IsFloatType(q->type())) {
        if (!HasGpuQuantKernel(q->type())) {
          return absl::InvalidArgumentError(absl::StrCat(
              "--gpu-weights quantized: ", name, " holds ", cpu::QuantTypeName(q->type()),
              " rows, which have no CUDA kernel (kept quantized: q4_0, q8_0, q4_K, q5_K, q6_K); "
              "use --gpu-weights bf16"));
        }
        part.rows = q->rows();
        part.format = q->type();
        part.row_bytes = q->row_bytes();
      } else {
        part.rows = std::visit([](const auto& x) { return x.rows(); }, p);
        part.row_bytes = m.cols() * 2;
      }
      if (row0 % 4 != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--gpu-weights quantized: ", name, " has a part starting at row ", row0,
            ", not a multiple of 4 (a 16-byte aligned GEMM output); use --gpu-weights bf16"));
      }
      Place(&part);
      out->parts.push_back(part);
      row0 += part.rows;
    }
    return absl::OkStatus();
  }

  // The whole matrix as one bf16 part.
  void WholeBf16(const cpu::Linear& m, GpuMatrixPlan* out) {
    out->rows = m.rows();
    out->cols = m.cols();
    out->parts.clear();
    GpuPart part;
    part.linear = &m;
    part.rows = m.rows();
    part.cols = m.cols();
    part.row_bytes = m.cols() * 2;
    Place(&part);
    out->parts.push_back(part);
  }

  GpuFloats Floats(const float* data, int64_t count) {
    GpuFloats f;
    if (count == 0) return f;
    f.data = data;
    f.count = count;
    f.offset = offset_;
    offset_ = AlignUp(offset_ + count * int64_t(sizeof(float)));
    Count("f32", count * int64_t(sizeof(float)));
    return f;
  }

  int64_t end() const { return offset_; }

 private:
  void Place(GpuPart* part) {
    part->bytes = part->rows * part->row_bytes;
    part->offset = offset_;
    offset_ = AlignUp(offset_ + part->bytes);
    Count(part->quantized() ? cpu::QuantTypeName(part->format) : "bf16", part->bytes);
  }

  void Count(const std::string& format, int64_t bytes) {
    for (auto& [name, b] : plan_->bytes_by_format) {
      if (name == format) {
        b += bytes;
        return;
      }
    }
    plan_->bytes_by_format.emplace_back(format, bytes);
  }

  GpuWeightPlan* plan_;
  int64_t offset_ = 0;
};

}  // namespace

int64_t GpuMatrixPlan::bytes() const {
  int64_t b = 0;
  for (const GpuPart& p : parts) b += p.bytes;
  return b;
}

bool HasGpuQuantKernel(cpu::QuantType type) {
  return type == QuantType::kQ4_0 || type == QuantType::kQ8_0 || type == QuantType::kQ4_K ||
         type == QuantType::kQ5_K || type == QuantType::kQ6_K;
}

absl::StatusOr<GpuWeightPlan> PlanGpuWeights(const Model& model, GpuWeights mode) {
  const ModelConfig& c = model.config;
  GpuWeightPlan plan;
  plan.mode = mode;
  Planner p(&plan);
  plan.layers.resize(model.layers.size());
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const LayerWeights& w = model.layers[l];
    GpuLayerPlan& o = plan.layers[l];
    const std::string layer = absl::StrCat("layer ", l, " ");
    for (auto [m, out, name] : {std::tuple{&w.wqkv, &o.wqkv, "wqkv (attn_q|k|v)"},
                                {&w.wo, &o.wo, "wo (attn_output)"},
                                {&w.w13, &o.w13, "w13 (ffn_gate|up)"},
                                {&w.w2, &o.w2, "w2 (ffn_down)"}}) {
      if (absl::Status s = p.Matrix(*m, layer + name, out); !s.ok()) return s;
    }
    o.rms_att = p.Floats(w.rms_att.data(), int64_t(w.rms_att.size()));
    o.rms_ffn = p.Floats(w.rms_ffn.data(), int64_t(w.rms_ffn.size()));
    o.bqkv = p.Floats(w.bqkv.data(), int64_t(w.bqkv.size()));
    o.q_norm = p.Floats(w.q_norm.data(), int64_t(w.q_norm.size()));
    o.k_norm = p.Floats(w.k_norm.data(), int64_t(w.k_norm.size()));
  }
  if (absl::Status s = p.Matrix(model.classifier, "the classifier (output)", &plan.classifier);
      !s.ok()) {
    return s;
  }
  const bool shared = c.shared_classifier || model.embedding.empty();
  if (shared && plan.classifier.parts.size() == 1) {
    plan.embedding = plan.classifier;
    plan.embedding_is_classifier = true;
  } else {
    // A table of its own (or a shared classifier of several parts, which the embedding kernels
    // cannot gather from): one quantized part when it is one, else bf16.
    const cpu::Linear& table = shared ? model.classifier : model.embedding;
    const auto* q =
        table.parts().size() == 1 ? std::get_if<cpu::QuantMatrix>(&table.parts()[0]) : nullptr;
    if (mode == GpuWeights::kQuantized && q != nullptr && HasGpuQuantKernel(q->type())) {
      if (absl::Status s = p.Matrix(table, "the token embedding (token_embd)", &plan.embedding);
          !s.ok()) {
        return s;
      }
    } else {
      p.WholeBf16(table, &plan.embedding);
    }
  }
  plan.rms_final = p.Floats(model.rms_final.data(), int64_t(model.rms_final.size()));
  plan.total_bytes = p.end();
  plan.step_bytes = plan.classifier.bytes();
  for (const GpuLayerPlan& o : plan.layers) {
    plan.step_bytes += o.wqkv.bytes() + o.wo.bytes() + o.w13.bytes() + o.w2.bytes();
  }
  return plan;
}

}  // namespace heavykv
