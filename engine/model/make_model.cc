#include "engine/model/make_model.h"

#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"

namespace heavykv {
namespace {

ModelConfig Shape(int32_t dim, int32_t hidden, int32_t layers, int32_t heads, int32_t kv_heads,
                  int32_t vocab, int32_t seq_len) {
  ModelConfig c;
  c.dim = dim;
  c.hidden_dim = hidden;
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.vocab_size = vocab;
  c.seq_len = seq_len;
  return c;
}

struct Rng {  // xorshift64*, deterministic across platforms
  uint64_t s;
  float Uniform() {  // in [-1, 1)
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return float((s * 0x2545F4914F6CDD1Dull) >> 40) / float(1 << 23) - 1.0f;
  }
};

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

absl::StatusOr<ModelConfig> NamedShape(absl::string_view name) {
  if (name == "stories260K") return Shape(64, 172, 5, 8, 4, 512, 512);
  if (name == "stories15M") return Shape(288, 768, 6, 6, 6, 32000, 256);
  if (name == "stories110M") return Shape(768, 2048, 12, 12, 12, 32000, 1024);
  if (name == "llama3-1b") return Shape(2048, 8192, 16, 32, 8, 128256, 4096);
  // Llama 3.2 1B and Llama 3 8B: the models' context is 131072 and 8192; 8192 for both here
  // keeps a benchmark's KV cache sane. Their rope scaling (rope_freqs) is not written.
  if (name == "llama3.2-1b" || name == "llama3-8b") {
    const bool small = name == "llama3.2-1b";
    ModelConfig c = small ? Shape(2048, 8192, 16, 32, 8, 128256, 8192)
                          : Shape(4096, 14336, 32, 32, 8, 128256, 8192);
    c.rope_theta = 500000.0f;
    c.rms_norm_eps = 1e-5f;
    c.shared_classifier = small;
    return c;
  }
  if (name == "qwen2.5-0.5b" || name == "qwen3-0.6b") {
    const bool qwen2 = name == "qwen2.5-0.5b";
    ModelConfig c = qwen2 ? Shape(896, 4864, 24, 14, 2, 151936, 32768)
                          : Shape(1024, 3072, 28, 16, 8, 151936, 40960);
    SetArchitecture(qwen2 ? Architecture::kQwen2 : Architecture::kQwen3, &c);
    if (!qwen2) c.head_size = 128;
    c.rope_theta = 1000000.0f;
    c.rms_norm_eps = 1e-6f;
    c.shared_classifier = true;
    return c;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model shape \"", name, "\"; choose one of: ", NamedShapeList(),
                   ", or give explicit dimensions"));
}

std::string NamedShapeList() {
  return "stories260K, stories15M, stories110M, llama3-1b, llama3.2-1b, llama3-8b, "
         "qwen2.5-0.5b, qwen3-0.6b";
}

absl::Status WriteRandomModel(const ModelConfig& config, uint64_t seed, const std::string& path) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  if (config.arch != Architecture::kLlama || config.q_dim() != config.dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("a llama2.c checkpoint holds only the llama architecture with heads of dim / "
                     "heads; write ", ArchitectureName(config.arch), " with --format gguf"));
  }
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "wb"));
  if (!f) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  const int32_t header[7] = {config.dim, config.hidden_dim, config.num_layers, config.num_heads,
                             config.num_kv_heads,
                             config.shared_classifier ? config.vocab_size : -config.vocab_size,
                             config.seq_len};
  bool ok = std::fwrite(header, sizeof(int32_t), 7, f.get()) == 7;
  Rng rng{seed * 0x9E3779B97F4A7C15ull + 1};
  std::vector<float> buf;
  // Writes `n` floats: uniform in +-scale, or all `scale` when constant.
  auto emit = [&](int64_t n, float scale, bool constant) {
    const int64_t kChunk = 1 << 20;
    for (int64_t done = 0; done < n && ok; done += kChunk) {
      const int64_t m = std::min(kChunk, n - done);
      buf.resize(m);
      for (int64_t i = 0; i < m; ++i) buf[i] = constant ? scale : scale * rng.Uniform();
      ok = std::fwrite(buf.data(), sizeof(float), m, f.get()) == size_t(m);
    }
  };
  const int64_t d = config.dim, hid = config.hidden_dim, L = config.num_layers;
  const int64_t kv = config.kv_dim(), V = config.vocab_size;
  const float sd = 1.0f / std::sqrt(float(d)), sh = 1.0f / std::sqrt(float(hid));
  emit(V * d, 1.0f, false);         // token embedding
  emit(L * d, 1.0f, true);          // rms_att
  emit(L * d * d, sd, false);       // wq
  emit(L * d * kv, sd, false);      // wk
  emit(L * d * kv, sd, false);      // wv
  emit(L * d * d, sd, false);       // wo
  emit(L * d, 1.0f, true);          // rms_ffn
  emit(L * d * hid, sd, false);     // w1
  emit(L * hid * d, sh, false);     // w2
  emit(L * d * hid, sd, false);     // w3
  emit(d, 1.0f, true);              // rms_final
  emit(int64_t(config.seq_len) * config.head_dim(), 0.0f, true);  // unused RoPE tables
  if (!config.shared_classifier) emit(V * d, sd, false);
  ok = ok && std::fflush(f.get()) == 0;
  if (!ok) return absl::DataLossError(absl::StrCat("short write to ", path));
  return absl::OkStatus();
}

}  // namespace heavykv
