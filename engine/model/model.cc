#include "engine/model/model.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/gguf/gguf.h"
#include "engine/model/gguf_model.h"

namespace heavykv {
namespace {

constexpr int64_t kHeaderBytes = 7 * sizeof(int32_t);

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

absl::StatusOr<ModelConfig> ParseHeader(std::FILE* f, const std::string& path) {
  int32_t h[7];
  if (std::fread(h, sizeof(int32_t), 7, f) != 7) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": truncated checkpoint (shorter than the 28-byte header)"));
  }
  // llama2.c stores a separate classifier as a negative vocab_size; INT32_MIN has no int32
  // magnitude, so reject it before negating.
  if (h[5] == std::numeric_limits<int32_t>::min()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": inconsistent header: vocab_size ", h[5], " cannot be valid (no int32 magnitude)"));
  }
  ModelConfig c;
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.num_layers = h[2];
  c.num_heads = h[3];
  c.num_kv_heads = h[4];
  c.shared_classifier = h[5] > 0;
  c.vocab_size = h[5] > 0 ? h[5] : -h[5];
  c.seq_len = h[6];
  if (absl::Status s = c.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  }
  return c;
}

// a * b + c, or false when it overflows int64 (or any operand is negative).
bool MulAdd(int64_t a, int64_t b, int64_t c, int64_t* out) {
  int64_t product;
  return a >= 0 && b >= 0 && c >= 0 && !__builtin_mul_overflow(a, b, &product) &&
         !__builtin_add_overflow(product, c, out);
}

// The checkpoint's size in bytes (header, tensors, RoPE tables) for a config whose fields are
// positive, or false when it does not fit int64: then no file can match it, and NumParams()
// would overflow.
bool CheckpointBytes(const ModelConfig& c, int64_t* bytes) {
  const int64_t d = c.dim, hid = c.hidden_dim, kv = c.kv_dim(), V = c.vocab_size;
  int64_t per_layer = 0, floats = 0;
  // per layer: 2 norms [d], wq and wo [d][d], wk and wv [kv][d], w1 and w3 [hid][d], w2 [d][hid]
  return MulAdd(2, d, 0, &per_layer) && MulAdd(2 * d, d, per_layer, &per_layer) &&
         MulAdd(2 * d, kv, per_layer, &per_layer) && MulAdd(3 * d, hid, per_layer, &per_layer) &&
         MulAdd(c.num_layers, per_layer, 0, &floats) &&
         MulAdd(c.shared_classifier ? 1 : 2, V * d, floats, &floats) &&  // embedding, classifier
         MulAdd(1, d, floats, &floats) &&                                  // final norm
         MulAdd(c.seq_len, c.head_dim(), floats, &floats) &&               // RoPE real + imag
         MulAdd(floats, int64_t(sizeof(float)), kHeaderBytes, bytes);
}

// Reads `n` floats of the checkpoint into dst.
bool ReadFloats(std::FILE* f, float* dst, int64_t n) {
  return std::fread(dst, sizeof(float), static_cast<size_t>(n), f) == static_cast<size_t>(n);
}

}  // namespace

const char* ArchitectureName(Architecture a) {
  switch (a) {
    case Architecture::kLlama:
      return "llama";
    case Architecture::kQwen2:
      return "qwen2";
    case Architecture::kQwen3:
      return "qwen3";
  }
  return "?";
}

void SetArchitecture(Architecture arch, ModelConfig* c) {
  c->arch = arch;
  c->rope_style = arch == Architecture::kLlama ? RopeStyle::kInterleaved : RopeStyle::kNeox;
  c->attention_bias = arch == Architecture::kQwen2;
  c->qk_norm = arch == Architecture::kQwen3;
}

absl::StatusOr<Architecture> ParseArchitecture(absl::string_view name) {
  for (Architecture a : {Architecture::kLlama, Architecture::kQwen2, Architecture::kQwen3}) {
    if (name == ArchitectureName(a)) return a;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown architecture \"", name, "\"; choose one of: llama, qwen2, qwen3"));
}

std::vector<int32_t> PromptWithBos(const ModelConfig& c, std::span<const int32_t> ids) {
  std::vector<int32_t> prompt;
  prompt.reserve(ids.size() + 1);
  if (c.add_bos && (ids.empty() || ids[0] != c.bos_id)) prompt.push_back(c.bos_id);
  prompt.insert(prompt.end(), ids.begin(), ids.end());
  return prompt;
}

int64_t ModelConfig::NumParams() const {
  const int64_t d = dim, hid = hidden_dim, L = num_layers, kv = kv_dim(), V = vocab_size,
                q = q_dim();
  int64_t per_layer = 2 * d + d * q * 2 + 2 * d * kv + 3 * d * hid;
  if (attention_bias) per_layer += q + 2 * kv;
  if (qk_norm) per_layer += 2 * int64_t(head_dim());
  return V * d + L * per_layer + d + (shared_classifier ? 0 : V * d);
}

absl::Status ModelConfig::Validate() const {
  if (dim <= 0 || hidden_dim <= 0 || num_layers <= 0 || num_heads <= 0 || num_kv_heads <= 0 ||
      vocab_size <= 0 || seq_len <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "inconsistent header: every field must be positive (dim ", dim, ", hidden_dim ",
        hidden_dim, ", n_layers ", num_layers, ", n_heads ", num_heads, ", n_kv_heads ",
        num_kv_heads, ", vocab_size ", vocab_size, ", seq_len ", seq_len, ")"));
  }
  if (head_size < 0 || (head_size == 0 && dim % num_heads != 0) || head_dim() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "inconsistent header: dim ", dim, " must split into ", num_heads,
        " heads of an even size (or the head size ", head_size, " must be even)"));
  }
  if (head_dim() > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported header: head size ", head_dim(), " is over 1024"));
  }
  if (!(rope_theta > 0 && rope_theta < 1e30f) || !(rms_norm_eps > 0 && rms_norm_eps < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("inconsistent header: rope theta ", rope_theta,
                                                   " must be positive and rms epsilon ",
                                                   rms_norm_eps, " in (0, 1)"));
  }
  if (num_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("inconsistent header: n_heads ", num_heads,
                                                   " is not a multiple of n_kv_heads ",
                                                   num_kv_heads));
  }
  if (int64_t(dim) * vocab_size > (int64_t(1) << 40) ||
      int64_t(dim) * hidden_dim > (int64_t(1) << 36)) {
    return absl::InvalidArgumentError("inconsistent header: dimensions are implausibly large");
  }
  // qkv_dim() and other per-row sizes are int32.
  const int64_t wide_qkv = (int64_t(num_heads) + 2 * int64_t(num_kv_heads)) * head_dim();
  if (wide_qkv > std::numeric_limits<int32_t>::max() ||
      2 * int64_t(hidden_dim) > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported header: dim ", dim, " (+ 2 x kv_dim ", kv_dim(), ") or 2 x hidden_dim ",
        hidden_dim, " does not fit an int32"));
  }
  int64_t bytes = 0;
  if (!CheckpointBytes(*this, &bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "inconsistent header: the checkpoint size overflows int64 (n_layers ", num_layers,
        ", seq_len ", seq_len, ")"));
  }
  // NumParams() and the loader's expected file size are int64 sums of products that each field
  // alone cannot overflow but all of them together can (a crafted header with 2^30 dim, 2^20
  // heads and a few layers did). Bound the total, in double so that the check itself cannot
  // overflow: 2^40 parameters (4 TiB of fp32) is far beyond any llama2.c checkpoint.
  const double d = dim, kv = double(num_kv_heads) * head_dim(), q = double(num_heads) * head_dim();
  const double params = 2 * double(vocab_size) * d + double(seq_len) * head_dim() +
                        double(num_layers) * (2 * d + 2 * d * q + 2 * d * kv + 3 * d * hidden_dim);
  if (params > double(int64_t(1) << 40)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "inconsistent header: dimensions are implausibly large (", params, " parameters)"));
  }
  return absl::OkStatus();
}

void Model::EmbedToken(int32_t token, float* out) const {
  (embedding.empty() ? classifier : embedding).Row(token, out);
}

int64_t Model::WeightBytes() const {
  // Every matrix once, as stored (fp32 or bf16 panels, the padding rows of a last panel not
  // counted; quantized blocks), the norms and biases in fp32. A separate embedding is only
  // gathered: not counted.
  int64_t bytes = 0;
  for (const LayerWeights& l : layers) {
    for (const cpu::Linear* w : {&l.wqkv, &l.wo, &l.w13, &l.w2}) bytes += w->bytes();
    bytes += int64_t(l.rms_att.size() + l.rms_ffn.size() + l.bqkv.size() + l.q_norm.size() +
                     l.k_norm.size()) *
             int64_t(sizeof(float));
  }
  bytes += classifier.bytes();
  return bytes + int64_t(rms_final.size()) * int64_t(sizeof(float));
}

int64_t Model::HeldBytes() const {
  return WeightBytes() + embedding.bytes() + int64_t(rope_freqs.size()) * int64_t(sizeof(float));
}

absl::StatusOr<ModelConfig> ReadModelConfig(const std::string& path) {
  if (IsGgufFile(path)) {
    absl::StatusOr<GgufFile> g = GgufFile::Open(path);
    if (!g.ok()) return g.status();
    return ReadGgufModelConfig(*g);
  }
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open model file ", path));
  return ParseHeader(f.get(), path);
}

absl::StatusOr<cpu::WeightType> ParseWeightDtype(absl::string_view name) {
  if (name == "auto" || name == "fp32") return cpu::WeightType::kFp32;
  if (name == "bf16") return cpu::WeightType::kBf16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown weight dtype \"", name, "\"; choose auto, fp32 or bf16"));
}

absl::StatusOr<Model> LoadModel(const std::string& path, cpu::WeightType weights) {
  if (IsGgufFile(path)) {
    // Quantized and F16 matrices stay in the mapping, which the Model's matrices keep open;
    // the rest is packed, and the mapping is released with the last matrix that views it.
    absl::StatusOr<GgufFile> g = GgufFile::Open(path);
    if (!g.ok()) return g.status();
    return LoadGgufModel(std::make_shared<const GgufFile>(*std::move(g)), weights);
  }
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open model file ", path));
  absl::StatusOr<ModelConfig> cfg = ParseHeader(f.get(), path);
  if (!cfg.ok()) return cfg.status();
  const ModelConfig& c = *cfg;

  const int64_t d = c.dim, hid = c.hidden_dim, L = c.num_layers, kv = c.kv_dim();
  const int64_t rope_floats = int64_t(c.seq_len) * c.head_dim();  // real + imaginary tables
  int64_t expected = 0;
  CheckpointBytes(c, &expected);  // Validate() checked that it fits
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot read the file size: ", ec.message()));
  }
  const int64_t actual = size > std::uintmax_t(std::numeric_limits<int64_t>::max())
                             ? std::numeric_limits<int64_t>::max()
                             : static_cast<int64_t>(size);
  if (actual != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": file is ", actual, " bytes but its header (dim ", c.dim, ", hidden ",
        c.hidden_dim, ", layers ", c.num_layers, ", heads ", c.num_heads, "/", c.num_kv_heads,
        ", vocab ", c.vocab_size, ", seq_len ", c.seq_len,
        c.shared_classifier ? ", shared classifier" : ", separate classifier", ") implies ",
        expected, actual < expected ? ": truncated" : ": trailing data"));
  }

  Model m;
  m.config = c;
  m.layers.resize(L);
  // The checkpoint stores each tensor for all layers at once, in file order. A fused matrix is
  // staged row-major for every layer, its parts read into their row blocks as the file reaches
  // them, and packed when complete; at most two fused matrices (w1|w3 while w2 is read) are
  // staged at a time.
  AlignedVector<float> embedding(c.vocab_size * d);
  bool ok = ReadFloats(f.get(), embedding.data(), c.vocab_size * d);
  auto read_vectors = [&](AlignedVector<float> LayerWeights::*member, int64_t n) {
    for (int64_t l = 0; l < L && ok; ++l) {
      (m.layers[l].*member).resize(n);
      ok = ReadFloats(f.get(), (m.layers[l].*member).data(), n);
    }
  };
  using Staging = std::vector<AlignedVector<float>>;  // [layer][rows][in]
  auto stage = [&](int64_t rows, int64_t in) {
    return Staging(L, AlignedVector<float>(rows * in));
  };
  // The next checkpoint tensor ([rows][in] for every layer) into rows [first, first + rows).
  auto read_part = [&](Staging& st, int64_t first, int64_t rows, int64_t in) {
    for (int64_t l = 0; l < L && ok; ++l) {
      ok = ReadFloats(f.get(), st[l].data() + first * in, rows * in);
    }
  };
  auto pack = [&](Staging& st, cpu::Linear LayerWeights::*member, int64_t rows, int64_t in) {
    for (int64_t l = 0; l < L && ok; ++l) {
      m.layers[l].*member =
          cpu::Linear(cpu::PackedMatrix::FromRowMajor(st[l].data(), rows, in, weights));
      AlignedVector<float>().swap(st[l]);
    }
  };
  read_vectors(&LayerWeights::rms_att, d);
  Staging wqkv = stage(d + 2 * kv, d);
  read_part(wqkv, 0, d, d);        // wq
  read_part(wqkv, d, kv, d);       // wk
  read_part(wqkv, d + kv, kv, d);  // wv
  pack(wqkv, &LayerWeights::wqkv, d + 2 * kv, d);
  Staging wo = stage(d, d);
  read_part(wo, 0, d, d);
  pack(wo, &LayerWeights::wo, d, d);
  read_vectors(&LayerWeights::rms_ffn, d);
  Staging w13 = stage(2 * hid, d), w2 = stage(d, hid);
  read_part(w13, 0, hid, d);  // w1 (gate)
  read_part(w2, 0, d, hid);
  pack(w2, &LayerWeights::w2, d, hid);
  read_part(w13, hid, hid, d);  // w3 (up)
  pack(w13, &LayerWeights::w13, 2 * hid, d);
  m.rms_final.resize(d);
  ok = ok && ReadFloats(f.get(), m.rms_final.data(), d);
  ok = ok && std::fseek(f.get(), rope_floats * int64_t(sizeof(float)), SEEK_CUR) == 0;
  if (ok && !c.shared_classifier) {
    AlignedVector<float> classifier(c.vocab_size * d);
    ok = ReadFloats(f.get(), classifier.data(), c.vocab_size * d);
    m.classifier =
        cpu::Linear(cpu::PackedMatrix::FromRowMajor(classifier.data(), c.vocab_size, d, weights));
    // A separate embedding stays fp32 (only gathered, one row per token).
    m.embedding = cpu::Linear(cpu::PackedMatrix::FromRowMajor(embedding.data(), c.vocab_size, d));
  } else if (ok) {
    m.classifier =
        cpu::Linear(cpu::PackedMatrix::FromRowMajor(embedding.data(), c.vocab_size, d, weights));
  }
  if (!ok) return absl::DataLossError(absl::StrCat(path, ": read error while loading weights"));
  return m;
}

}  // namespace heavykv
