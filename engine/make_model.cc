#include "engine/make_model.h"

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
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model shape \"", name, "\"; choose one of: ", NamedShapeList(),
                   ", or give explicit dimensions"));
}

std::string NamedShapeList() { return "stories260K, stories15M, stories110M, llama3-1b"; }

absl::Status WriteRandomModel(const ModelConfig& config, uint64_t seed, const std::string& path) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
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
