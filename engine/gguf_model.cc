#include "engine/gguf_model.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/gguf_support.h"
#include "kernels/cpu/quant_types.h"

namespace heavykv {
namespace {

absl::Status Prefixed(const GgufFile& f, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(f.path(), ": ", s.message()));
}

// A positive int32 from `key`, or its default when the key is absent and `fallback` > 0.
absl::Status ReadPositive(const GgufFile& f, const std::string& key, int32_t fallback,
                          int32_t* out) {
  if (fallback > 0 && f.FindMetadata(key) == nullptr) {
    *out = fallback;
    return absl::OkStatus();
  }
  absl::StatusOr<int32_t> v = f.GetI32(key);
  if (!v.ok()) return v.status();  // already names the file and the key
  if (*v <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.path(), ": metadata key '", key, "' is ", *v, ", must be positive"));
  }
  *out = *v;
  return absl::OkStatus();
}

// The tensor `name` of type F32, F16 or BF16 with dims [cols, rows] (rows == 0: a vector
// [cols]); errors name the tensor.
absl::StatusOr<const GgufTensor*> FindWeight(const GgufFile& f, const std::string& name,
                                             int64_t cols, int64_t rows) {
  const GgufTensor* t = f.FindTensor(name);
  if (t == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": tensor '", name, "' is missing"));
  }
  const std::vector<int64_t> want =
      rows == 0 ? std::vector<int64_t>{cols} : std::vector<int64_t>{cols, rows};
  const std::span<const int64_t> have = t->shape();
  if (!std::equal(have.begin(), have.end(), want.begin(), want.end())) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.path(), ": tensor '", name, "' has shape [", absl::StrJoin(have, ", "),
                     "], the metadata implies [", absl::StrJoin(want, ", "), "]"));
  }
  switch (t->type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
      return t;
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return absl::UnimplementedError(absl::StrCat(
          f.path(), ": tensor '", name, "' has type ", GgmlTypeName(t->type),
          ": quantized weights are not run yet (issue 14); use an F32, F16 or BF16 file"));
    default:
      return absl::InvalidArgumentError(absl::StrCat(f.path(), ": tensor '", name, "' has type ",
                                                     GgmlTypeName(t->type),
                                                     ", not a weight type (F32, F16, BF16)"));
  }
}

// dst[rows * cols] (row-major fp32) = the tensor's values; its type and shape were checked.
void ToFloat(const GgufTensor& t, float* dst) {
  if (t.type == GgmlType::kF32) {
    std::memcpy(dst, t.data.data(), t.data.size());
    return;
  }
  const cpu::QuantType q = t.type == GgmlType::kF16 ? cpu::QuantType::kF16 : cpu::QuantType::kBf16;
  const int64_t cols = t.dims[0], rows = t.num_elements / cols;
  for (int64_t r = 0; r < rows; ++r) {
    cpu::DequantizeRow(q, t.data.data() + r * cols * 2, dst + r * cols, cols);
  }
}

}  // namespace

absl::StatusOr<ModelConfig> ReadGgufModelConfig(const GgufFile& f) {
  absl::StatusOr<absl::string_view> arch = f.GetString("general.architecture");
  if (!arch.ok()) return arch.status();
  if (*arch != "llama") {
    const auto known = SupportedGgufArchitectures();
    const bool planned = std::find(known.begin(), known.end(), *arch) != known.end();
    return absl::Status(
        planned ? absl::StatusCode::kUnimplemented : absl::StatusCode::kInvalidArgument,
        absl::StrCat(f.path(), ": architecture '", *arch, "' is ",
                     planned ? "not loaded yet" : "not supported", " (heavykv loads llama)"));
  }
  ModelConfig c;
  for (const auto& [key, field, fallback] :
       {std::tuple<const char*, int32_t*, int32_t>{"llama.embedding_length", &c.dim, 0},
        {"llama.feed_forward_length", &c.hidden_dim, 0},
        {"llama.block_count", &c.num_layers, 0},
        {"llama.attention.head_count", &c.num_heads, 0},
        {"llama.context_length", &c.seq_len, 0}}) {
    if (absl::Status s = ReadPositive(f, key, fallback, field); !s.ok()) return s;
  }
  // llama.cpp's default too: without the key, every head has its own K/V.
  if (absl::Status s =
          ReadPositive(f, "llama.attention.head_count_kv", c.num_heads, &c.num_kv_heads);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<float> eps = f.GetF32("llama.attention.layer_norm_rms_epsilon");
  if (!eps.ok()) return eps.status();
  c.rms_norm_eps = *eps;
  if (f.FindMetadata("llama.rope.freq_base") != nullptr) {
    absl::StatusOr<float> theta = f.GetF32("llama.rope.freq_base");
    if (!theta.ok()) return theta.status();
    c.rope_theta = *theta;
  }
  const GgufTensor* emb = f.FindTensor("token_embd.weight");
  if (emb == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.path(), ": tensor 'token_embd.weight' is missing"));
  }
  if (emb->num_dims != 2 || emb->dims[0] != c.dim || emb->dims[1] > (int64_t(1) << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.path(), ": tensor 'token_embd.weight' has shape [",
                     absl::StrJoin(emb->shape(), ", "), "], want [", c.dim, ", vocab size]"));
  }
  c.vocab_size = static_cast<int32_t>(emb->dims[1]);
  c.shared_classifier = true;  // LoadGgufModel decides from output.weight
  if (absl::Status s = c.Validate(); !s.ok()) return Prefixed(f, s);

  // What the runner does not do yet: say so instead of computing something else.
  const int32_t hd = c.head_dim();
  for (const char* key : {"llama.rope.dimension_count", "llama.attention.key_length",
                          "llama.attention.value_length"}) {
    if (f.FindMetadata(key) == nullptr) continue;
    absl::StatusOr<int32_t> v = f.GetI32(key);
    if (!v.ok()) return v.status();
    if (*v != hd) {
      return absl::UnimplementedError(absl::StrCat(f.path(), ": metadata key '", key, "' is ", *v,
                                                   "; heavykv runs only ", hd,
                                                   " (embedding_length / head_count)"));
    }
  }
  if (const GgufMetadata* m = f.FindMetadata("llama.rope.scaling.type"); m != nullptr) {
    absl::StatusOr<absl::string_view> type = f.GetString("llama.rope.scaling.type");
    if (!type.ok()) return type.status();
    if (*type != "none") {
      return absl::UnimplementedError(
          absl::StrCat(f.path(), ": rope scaling '", *type, "' is not run yet"));
    }
  }
  if (f.FindTensor("rope_freqs.weight") != nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        f.path(), ": tensor 'rope_freqs.weight' (Llama 3.1 rope scaling) is not run yet"));
  }
  return c;
}

absl::StatusOr<Model> LoadGgufModel(const GgufFile& f, cpu::WeightType weights) {
  absl::StatusOr<ModelConfig> cfg = ReadGgufModelConfig(f);
  if (!cfg.ok()) return cfg.status();
  ModelConfig c = *cfg;
  const int64_t d = c.dim, hid = c.hidden_dim, kv = c.kv_dim(), V = c.vocab_size;

  // Every tensor is checked before any is converted, so a bad file fails before the work.
  struct LayerTensors {
    const GgufTensor *attn_norm, *q, *k, *v, *o, *ffn_norm, *gate, *up, *down;
  };
  std::vector<LayerTensors> lt(c.num_layers);
  absl::Status status;
  auto need = [&](const std::string& name, int64_t cols, int64_t rows) -> const GgufTensor* {
    if (!status.ok()) return nullptr;
    absl::StatusOr<const GgufTensor*> t = FindWeight(f, name, cols, rows);
    if (!t.ok()) status = t.status();
    return t.ok() ? *t : nullptr;
  };
  const GgufTensor* emb = need("token_embd.weight", d, V);
  const GgufTensor* norm = need("output_norm.weight", d, 0);
  const GgufTensor* out = f.FindTensor("output.weight") ? need("output.weight", d, V) : nullptr;
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const std::string b = absl::StrCat("blk.", l, ".");
    lt[l] = {need(b + "attn_norm.weight", d, 0),   need(b + "attn_q.weight", d, d),
             need(b + "attn_k.weight", d, kv),     need(b + "attn_v.weight", d, kv),
             need(b + "attn_output.weight", d, d), need(b + "ffn_norm.weight", d, 0),
             need(b + "ffn_gate.weight", d, hid),  need(b + "ffn_up.weight", d, hid),
             need(b + "ffn_down.weight", hid, d)};
  }
  if (!status.ok()) return status;
  // A converter may write a classifier that is the embedding (llama.cpp's llama2.c converter
  // does): share it, as the checkpoint it came from does.
  c.shared_classifier =
      out == nullptr || (out->type == emb->type && std::equal(out->data.begin(), out->data.end(),
                                                              emb->data.begin(), emb->data.end()));

  Model m;
  m.config = c;
  m.layers.resize(c.num_layers);
  auto vector = [](const GgufTensor& t) {
    AlignedVector<float> v(t.num_elements);
    ToFloat(t, v.data());
    return v;
  };
  // Each fused matrix is staged row-major for one layer at a time, then packed.
  AlignedVector<float> staging;
  auto fused = [&](std::initializer_list<const GgufTensor*> parts) {
    int64_t rows = 0;
    const int64_t cols = (*parts.begin())->dims[0];
    for (const GgufTensor* t : parts) rows += t->dims[1];
    staging.resize(rows * cols);
    int64_t r = 0;
    for (const GgufTensor* t : parts) {
      ToFloat(*t, staging.data() + r * cols);
      r += t->dims[1];
    }
    return cpu::PackedMatrix::FromRowMajor(staging.data(), rows, cols, weights);
  };
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const LayerTensors& t = lt[l];
    LayerWeights& w = m.layers[l];
    w.rms_att = vector(*t.attn_norm);
    w.wqkv = fused({t.q, t.k, t.v});
    w.wo = fused({t.o});
    w.rms_ffn = vector(*t.ffn_norm);
    w.w13 = fused({t.gate, t.up});
    w.w2 = fused({t.down});
  }
  m.rms_final = vector(*norm);
  if (c.shared_classifier) {
    m.classifier = fused({emb});
  } else {
    m.classifier = fused({out});
    m.embedding_storage = vector(*emb);
  }
  return m;
}

}  // namespace heavykv
