#include "engine/model/gguf_model.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/model/gguf_support.h"
#include "kernels/cpu/quant_matrix.h"
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

// The tensor `name` with dims [cols, rows] (rows == 0: a vector [cols]) and a type heavykv runs
// (SupportedGgmlTypes: a float type, or for a matrix also a block format); errors name the
// tensor.
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
  const bool vector = rows == 0;
  const bool is_float =
      t->type == GgmlType::kF32 || t->type == GgmlType::kF16 || t->type == GgmlType::kBF16;
  const std::span<const GgmlType> runs = SupportedGgmlTypes();
  const bool supported = std::find(runs.begin(), runs.end(), t->type) != runs.end();
  if (is_float || (supported && !vector)) return t;
  if (supported) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.path(), ": tensor '", name, "' is a vector of type ",
                     GgmlTypeName(t->type), "; norms and biases must be F32, F16 or BF16"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      f.path(), ": tensor '", name, "' has type ", GgmlTypeName(t->type),
      vector ? ", not a vector type (F32, F16, BF16)"
             : ", not a weight type (F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K)"));
}

// dst[rows * cols] (row-major fp32) = the tensor's values; its type and shape were checked.
void ToFloat(const GgufTensor& t, float* dst) {
  if (t.type == GgmlType::kF32) {
    std::memcpy(dst, t.data.data(), t.data.size());
    return;
  }
  const cpu::QuantType q = t.type == GgmlType::kF16 ? cpu::QuantType::kF16 : cpu::QuantType::kBF16;
  const int64_t cols = t.dims[0], rows = t.num_elements / cols;
  for (int64_t r = 0; r < rows; ++r) {
    cpu::DequantizeRow(q, t.data.data() + r * cols * 2, dst + r * cols, cols);
  }
}

}  // namespace

absl::StatusOr<ModelConfig> ReadGgufModelConfig(const GgufFile& f) {
  absl::StatusOr<absl::string_view> arch_name = f.GetString("general.architecture");
  if (!arch_name.ok()) return arch_name.status();
  ModelConfig c;
  if (absl::StatusOr<Architecture> arch = ParseArchitecture(*arch_name); arch.ok()) {
    SetArchitecture(*arch, &c);
  } else {
    const auto known = SupportedGgufArchitectures();
    return absl::InvalidArgumentError(
        absl::StrCat(f.path(), ": architecture '", *arch_name, "' is not supported (heavykv runs ",
                     absl::StrJoin(known, ", "), ")"));
  }
  const std::string a(*arch_name);
  for (const auto& [key, field, fallback] :
       {std::tuple<std::string, int32_t*, int32_t>{a + ".embedding_length", &c.dim, 0},
        {a + ".feed_forward_length", &c.hidden_dim, 0},
        {a + ".block_count", &c.num_layers, 0},
        {a + ".attention.head_count", &c.num_heads, 0},
        {a + ".context_length", &c.seq_len, 0}}) {
    if (absl::Status s = ReadPositive(f, key, fallback, field); !s.ok()) return s;
  }
  // llama.cpp's default too: without the key, every head has its own K/V.
  if (absl::Status s =
          ReadPositive(f, a + ".attention.head_count_kv", c.num_heads, &c.num_kv_heads);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<float> eps = f.GetF32(a + ".attention.layer_norm_rms_epsilon");
  if (!eps.ok()) return eps.status();
  c.rms_norm_eps = *eps;
  if (f.FindMetadata(a + ".rope.freq_base") != nullptr) {
    absl::StatusOr<float> theta = f.GetF32(a + ".rope.freq_base");
    if (!theta.ok()) return theta.status();
    c.rope_theta = *theta;
  }
  // The head size: key_length when given (Qwen3's heads are wider than dim / heads), else
  // dim / heads. Values must have the keys' size, and rope must rotate whole heads.
  int32_t key_length = 0;
  if (f.FindMetadata(a + ".attention.key_length") != nullptr) {
    if (absl::Status s = ReadPositive(f, a + ".attention.key_length", 0, &key_length); !s.ok()) {
      return s;
    }
    if (key_length != c.dim / c.num_heads) c.head_size = key_length;
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
  for (const auto& [key, field] : {std::pair<const char*, int32_t*>{
                                       "tokenizer.ggml.bos_token_id", &c.bos_id},
                                   {"tokenizer.ggml.eos_token_id", &c.eos_id}}) {
    if (f.FindMetadata(key) == nullptr) continue;
    absl::StatusOr<uint32_t> id = f.GetU32(key);
    if (!id.ok()) return id.status();
    if (*id >= uint32_t(c.vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat(f.path(), ": metadata key '", key, "' is ",
                                                     *id, ", outside the vocabulary of ",
                                                     c.vocab_size));
    }
    *field = static_cast<int32_t>(*id);
  }
  if (f.FindMetadata("tokenizer.ggml.add_bos_token") != nullptr) {
    absl::StatusOr<bool> add = f.GetBool("tokenizer.ggml.add_bos_token");
    if (!add.ok()) return add.status();
    c.add_bos = *add;
  }
  c.rope_freq_factors = f.FindTensor("rope_freqs.weight") != nullptr;
  if (absl::Status s = c.Validate(); !s.ok()) return Prefixed(f, s);

  // What the runner does not do: say so instead of computing something else.
  const int32_t hd = c.head_dim();
  for (const std::string& key : {a + ".rope.dimension_count", a + ".attention.value_length"}) {
    if (f.FindMetadata(key) == nullptr) continue;
    absl::StatusOr<int32_t> v = f.GetI32(key);
    if (!v.ok()) return v.status();
    if (*v != hd) {
      return absl::UnimplementedError(absl::StrCat(
          f.path(), ": metadata key '", key, "' is ", *v, "; heavykv runs only ", hd,
          key_length > 0 ? " (attention.key_length)" : " (embedding_length / head_count)"));
    }
  }
  if (f.FindMetadata(a + ".rope.scaling.type") != nullptr) {
    absl::StatusOr<absl::string_view> type = f.GetString(a + ".rope.scaling.type");
    if (!type.ok()) return type.status();
    if (*type != "none" && !(*type == "llama3" && c.rope_freq_factors)) {
      return absl::UnimplementedError(
          absl::StrCat(f.path(), ": rope scaling '", *type, "' is not run yet"));
    }
  }
  return c;
}

namespace {

absl::StatusOr<Model> Load(const GgufFile& f, cpu::WeightType weights,
                           const std::shared_ptr<const GgufFile>& owner) {
  absl::StatusOr<ModelConfig> cfg = ReadGgufModelConfig(f);
  if (!cfg.ok()) return cfg.status();
  ModelConfig c = *cfg;
  const int64_t d = c.dim, hid = c.hidden_dim, kv = c.kv_dim(), q = c.q_dim(), V = c.vocab_size,
                hd = c.head_dim();

  // Every tensor is checked before any is converted, so a bad file fails before the work.
  struct LayerTensors {
    const GgufTensor *attn_norm, *q, *k, *v, *o, *ffn_norm, *gate, *up, *down;
    const GgufTensor *q_bias = nullptr, *k_bias = nullptr, *v_bias = nullptr;
    const GgufTensor *q_norm = nullptr, *k_norm = nullptr;
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
  const GgufTensor* freqs = c.rope_freq_factors ? need("rope_freqs.weight", hd / 2, 0) : nullptr;
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const std::string b = absl::StrCat("blk.", l, ".");
    LayerTensors& t = lt[l];
    t = {need(b + "attn_norm.weight", d, 0),   need(b + "attn_q.weight", d, q),
         need(b + "attn_k.weight", d, kv),     need(b + "attn_v.weight", d, kv),
         need(b + "attn_output.weight", q, d), need(b + "ffn_norm.weight", d, 0),
         need(b + "ffn_gate.weight", d, hid),  need(b + "ffn_up.weight", d, hid),
         need(b + "ffn_down.weight", hid, d)};
    if (c.attention_bias) {
      t.q_bias = need(b + "attn_q.bias", q, 0);
      t.k_bias = need(b + "attn_k.bias", kv, 0);
      t.v_bias = need(b + "attn_v.bias", kv, 0);
    }
    if (c.qk_norm) {
      t.q_norm = need(b + "attn_q_norm.weight", hd, 0);
      t.k_norm = need(b + "attn_k_norm.weight", hd, 0);
    }
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
  // A fused matrix: the parts' rows in order. F32 parts are staged row-major and packed as
  // `type` (fp32 unless --weight-dtype bf16), BF16 parts as bf16 panels (exact), runs of
  // consecutive parts that pack alike together; F16 and quantized parts keep the file's bytes (a
  // QuantMatrix, merged with a preceding part of its type by Linear::Append), so they take no
  // more memory than in the file.
  AlignedVector<float> staging;
  auto fused = [&](std::initializer_list<const GgufTensor*> parts,
                   cpu::WeightType type) -> absl::StatusOr<cpu::Linear> {
    cpu::Linear lin;
    const int64_t cols = (*parts.begin())->dims[0];
    int64_t staged = 0;  // rows staged, not yet packed
    cpu::WeightType staged_type = type;
    auto flush = [&]() -> absl::Status {
      if (staged == 0) return absl::OkStatus();
      absl::Status s =
          lin.Append(cpu::PackedMatrix::FromRowMajor(staging.data(), staged, cols, staged_type));
      staged = 0;
      return s;
    };
    for (const GgufTensor* t : parts) {
      const int64_t rows = t->dims[1];
      if (t->type == GgmlType::kF32 || t->type == GgmlType::kBF16) {
        const cpu::WeightType pack = t->type == GgmlType::kBF16 ? cpu::WeightType::kBf16 : type;
        if (staged > 0 && pack != staged_type) {
          if (absl::Status s = flush(); !s.ok()) return s;
        }
        staged_type = pack;
        staging.resize((staged + rows) * cols);
        ToFloat(*t, staging.data() + staged * cols);
        staged += rows;
        continue;
      }
      if (absl::Status s = flush(); !s.ok()) return s;
      absl::StatusOr<cpu::QuantType> qt = cpu::QuantTypeFromGgmlId(uint32_t(t->type));
      if (!qt.ok()) return qt.status();
      absl::StatusOr<cpu::QuantMatrix> qm =
          owner != nullptr
              ? cpu::QuantMatrix::View(*qt, rows, cols, t->data.data(),
                                       static_cast<int64_t>(t->data.size()), owner)
              : cpu::QuantMatrix::FromRows(*qt, rows, cols, t->data.data(),
                                           static_cast<int64_t>(t->data.size()));
      if (!qm.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(f.path(), ": tensor '", t->name, "': ", qm.status().message()));
      }
      if (absl::Status s = lin.Append(*std::move(qm)); !s.ok()) return s;
    }
    if (absl::Status s = flush(); !s.ok()) return s;
    return lin;
  };
  auto set = [&](cpu::Linear* dst, std::initializer_list<const GgufTensor*> parts,
                 cpu::WeightType type) {
    if (!status.ok()) return;
    absl::StatusOr<cpu::Linear> lin = fused(parts, type);
    if (lin.ok()) {
      *dst = *std::move(lin);
    } else {
      status = lin.status();
    }
  };
  for (int32_t l = 0; l < c.num_layers && status.ok(); ++l) {
    const LayerTensors& t = lt[l];
    LayerWeights& w = m.layers[l];
    w.rms_att = vector(*t.attn_norm);
    set(&w.wqkv, {t.q, t.k, t.v}, weights);
    if (c.attention_bias) {
      w.bqkv.resize(q + 2 * kv);
      ToFloat(*t.q_bias, w.bqkv.data());
      ToFloat(*t.k_bias, w.bqkv.data() + q);
      ToFloat(*t.v_bias, w.bqkv.data() + q + kv);
    }
    if (c.qk_norm) {
      w.q_norm = vector(*t.q_norm);
      w.k_norm = vector(*t.k_norm);
    }
    set(&w.wo, {t.o}, weights);
    w.rms_ffn = vector(*t.ffn_norm);
    set(&w.w13, {t.gate, t.up}, weights);
    set(&w.w2, {t.down}, weights);
  }
  m.rms_final = vector(*norm);
  if (freqs != nullptr) m.rope_freqs = vector(*freqs);
  if (c.shared_classifier) {
    set(&m.classifier, {emb}, weights);
  } else {
    set(&m.classifier, {out}, weights);
    // A separate embedding is only gathered (one row per token): fp32 when the file's is a
    // float type, else the file's blocks.
    set(&m.embedding, {emb}, cpu::WeightType::kFp32);
  }
  if (!status.ok()) return status;
  return m;
}

}  // namespace

absl::StatusOr<Model> LoadGgufModel(const GgufFile& f, cpu::WeightType weights) {
  return Load(f, weights, nullptr);
}

absl::StatusOr<Model> LoadGgufModel(std::shared_ptr<const GgufFile> file,
                                    cpu::WeightType weights) {
  return Load(*file, weights, file);
}

}  // namespace heavykv
