// The three GGUF architectures against a direct reference: small random models of llama (with
// Llama 3.1's rope_freqs), qwen2 (q/k/v biases, NEOX rope) and qwen3 (per-head q/k RMSNorm, heads
// wider than dim / heads) are written with GgufWriter, loaded by LoadModel, run by the CPU
// ModelRunner, and compared logit by logit with a plain double-precision forward pass written here
// from the architectures' definitions (Hugging Face's modeling code: rotate_half for NEOX, q/k
// norms before rope, biases after the projections). Also: the quantized matrices of such a model
// stay quantized in memory, at most 1.1x the file's tensor bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/gguf/gguf.h"
#include "engine/gguf/gguf_writer.h"
#include "engine/model/model.h"
#include "engine/runner/model_runner.h"
#include "kernels/cpu/quant_types.h"
#include "tests/test_util.h"

namespace heavykv {
namespace {

using testing::TempDir;

struct Spec {
  std::string arch = "llama";
  int dim = 64, hidden = 96, layers = 2, heads = 4, kv_heads = 2, vocab = 40, head_size = 0;
  float theta = 10000.0f, eps = 1e-5f;
  bool neox = false, bias = false, qk_norm = false, rope_freqs = false, tied = false;
  GgmlType matrix_type = GgmlType::kF32;
  int bos = -1, eos = -1, add_bos = -1;  // tokenizer.ggml.* keys; -1: not written
  int hd() const { return head_size > 0 ? head_size : dim / heads; }
};

// A tensor as the reference sees it: row-major [rows][cols] (ggml dims {cols, rows}), the values
// after the file's rounding (dequantized when the file stores it quantized).
struct Tensor {
  int64_t rows = 0, cols = 0;
  std::vector<double> v;
  double at(int64_t r, int64_t c) const { return v[r * cols + c]; }
};

class RandomModel {
 public:
  RandomModel(const Spec& s, uint32_t seed) : s_(s), rng_(seed) {}

  // A matrix [rows][cols] of the spec's type, uniform in +-scale.
  Tensor& Matrix(const std::string& name, int64_t rows, int64_t cols, double scale) {
    return Add(name, rows, cols, scale, 0.0, s_.matrix_type);
  }
  // A vector of F32, center +- scale.
  Tensor& Vector(const std::string& name, int64_t n, double center, double scale) {
    return Add(name, 1, n, scale, center, GgmlType::kF32);
  }
  const Tensor& operator[](const std::string& name) const { return tensors_.at(name); }
  bool has(const std::string& name) const { return tensors_.count(name) > 0; }
  GgufWriter& writer() { return w_; }

 private:
  Tensor& Add(const std::string& name, int64_t rows, int64_t cols, double scale, double center,
              GgmlType type) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> f(rows * cols);
    for (float& x : f) x = float(center + scale * u(rng_));
    const cpu::QuantType qt = static_cast<cpu::QuantType>(type);
    const int64_t row_bytes = cpu::QuantRowBytes(qt, cols);
    std::string bytes(rows * row_bytes, '\0');
    std::vector<float> back(cols);
    Tensor t{rows, cols, std::vector<double>(rows * cols)};
    for (int64_t r = 0; r < rows; ++r) {
      cpu::QuantizeRow(qt, &f[r * cols], &bytes[r * row_bytes], cols);
      cpu::DequantizeRow(qt, &bytes[r * row_bytes], back.data(), cols);
      for (int64_t c = 0; c < cols; ++c) t.v[r * cols + c] = back[c];
    }
    std::vector<int64_t> dims = rows == 1 ? std::vector<int64_t>{cols}
                                          : std::vector<int64_t>{cols, rows};
    EXPECT_TRUE(w_.AddTensor(name, type, dims, bytes).ok()) << name;
    return tensors_[name] = std::move(t);
  }

  Spec s_;
  std::mt19937 rng_;
  GgufWriter w_;
  std::map<std::string, Tensor> tensors_;
};

// Writes the spec's model to `path`; returns its tensors for the reference.
RandomModel WriteModel(const Spec& s, const std::string& path) {
  RandomModel m(s, 1234);
  GgufWriter& w = m.writer();
  const std::string a = s.arch;
  const int hd = s.hd(), q = s.heads * hd, kv = s.kv_heads * hd;
  w.AddString("general.architecture", a);
  w.AddU32(a + ".context_length", 128);
  w.AddU32(a + ".embedding_length", s.dim);
  w.AddU32(a + ".block_count", s.layers);
  w.AddU32(a + ".feed_forward_length", s.hidden);
  w.AddU32(a + ".attention.head_count", s.heads);
  w.AddU32(a + ".attention.head_count_kv", s.kv_heads);
  w.AddU32(a + ".rope.dimension_count", hd);
  w.AddF32(a + ".rope.freq_base", s.theta);
  w.AddF32(a + ".attention.layer_norm_rms_epsilon", s.eps);
  if (s.bos >= 0) w.AddU32("tokenizer.ggml.bos_token_id", s.bos);
  if (s.eos >= 0) w.AddU32("tokenizer.ggml.eos_token_id", s.eos);
  if (s.add_bos >= 0) w.AddBool("tokenizer.ggml.add_bos_token", s.add_bos == 1);
  if (s.head_size > 0) {
    w.AddU32(a + ".attention.key_length", hd);
    w.AddU32(a + ".attention.value_length", hd);
  }
  m.Matrix("token_embd.weight", s.vocab, s.dim, 1.0);
  m.Vector("output_norm.weight", s.dim, 1.0, 0.2);
  if (!s.tied) m.Matrix("output.weight", s.vocab, s.dim, 0.3);
  if (s.rope_freqs) m.Vector("rope_freqs.weight", hd / 2, 4.0, 3.0);  // divisors in [1, 7]
  for (int l = 0; l < s.layers; ++l) {
    const std::string b = absl::StrCat("blk.", l, ".");
    m.Vector(b + "attn_norm.weight", s.dim, 1.0, 0.2);
    m.Matrix(b + "attn_q.weight", q, s.dim, 0.4);
    m.Matrix(b + "attn_k.weight", kv, s.dim, 0.4);
    m.Matrix(b + "attn_v.weight", kv, s.dim, 0.4);
    if (s.bias) {
      m.Vector(b + "attn_q.bias", q, 0.0, 0.5);
      m.Vector(b + "attn_k.bias", kv, 0.0, 0.5);
      m.Vector(b + "attn_v.bias", kv, 0.0, 0.5);
    }
    if (s.qk_norm) {
      m.Vector(b + "attn_q_norm.weight", hd, 1.0, 0.5);
      m.Vector(b + "attn_k_norm.weight", hd, 1.0, 0.5);
    }
    m.Matrix(b + "attn_output.weight", s.dim, q, 0.2);
    m.Vector(b + "ffn_norm.weight", s.dim, 1.0, 0.2);
    m.Matrix(b + "ffn_gate.weight", s.hidden, s.dim, 0.3);
    m.Matrix(b + "ffn_up.weight", s.hidden, s.dim, 0.3);
    m.Matrix(b + "ffn_down.weight", s.dim, s.hidden, 0.2);
  }
  EXPECT_TRUE(w.WriteFile(path).ok());
  return m;
}

std::vector<double> MatVec(const Tensor& w, const std::vector<double>& x) {
  std::vector<double> y(w.rows, 0.0);
  for (int64_t r = 0; r < w.rows; ++r) {
    for (int64_t c = 0; c < w.cols; ++c) y[r] += w.at(r, c) * x[c];
  }
  return y;
}

// x[off .. off + n) = w * x / rms(x).
void RmsNormInPlace(std::vector<double>& x, int64_t off, int64_t n, const Tensor& w, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[off + i] * x[off + i];
  const double scale = 1.0 / std::sqrt(ss / n + eps);
  for (int64_t i = 0; i < n; ++i) x[off + i] = w.v[i] * x[off + i] * scale;
}

// Rotates each head of size hd of x (n_heads of them) for position pos.
void RopeInPlace(std::vector<double>& x, int n_heads, int hd, int pos, const Spec& s,
                 const RandomModel& m) {
  for (int h = 0; h < n_heads; ++h) {
    for (int j = 0; j < hd / 2; ++j) {
      double freq = std::pow(double(s.theta), -2.0 * j / hd);
      if (s.rope_freqs) freq /= m["rope_freqs.weight"].v[j];
      const double c = std::cos(pos * freq), sn = std::sin(pos * freq);
      const int i0 = h * hd + (s.neox ? j : 2 * j);
      const int i1 = h * hd + (s.neox ? j + hd / 2 : 2 * j + 1);
      const double a = x[i0], b = x[i1];
      x[i0] = a * c - b * sn;
      x[i1] = a * sn + b * c;
    }
  }
}

// Logits [tokens][vocab] of the whole sequence, causal attention over every earlier position.
std::vector<std::vector<double>> ReferenceForward(const Spec& s, const RandomModel& m,
                                                  const std::vector<int32_t>& tokens) {
  const int T = int(tokens.size()), hd = s.hd(), G = s.heads / s.kv_heads, q_dim = s.heads * hd,
            kv_dim = s.kv_heads * hd;
  std::vector<std::vector<double>> x(T, std::vector<double>(s.dim));
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < s.dim; ++i) x[t][i] = m["token_embd.weight"].at(tokens[t], i);
  }
  for (int l = 0; l < s.layers; ++l) {
    const std::string b = absl::StrCat("blk.", l, ".");
    std::vector<std::vector<double>> q(T), k(T), v(T);
    for (int t = 0; t < T; ++t) {
      std::vector<double> xb = x[t];
      RmsNormInPlace(xb, 0, s.dim, m[b + "attn_norm.weight"], s.eps);
      q[t] = MatVec(m[b + "attn_q.weight"], xb);
      k[t] = MatVec(m[b + "attn_k.weight"], xb);
      v[t] = MatVec(m[b + "attn_v.weight"], xb);
      if (s.bias) {
        for (int i = 0; i < q_dim; ++i) q[t][i] += m[b + "attn_q.bias"].v[i];
        for (int i = 0; i < kv_dim; ++i) k[t][i] += m[b + "attn_k.bias"].v[i];
        for (int i = 0; i < kv_dim; ++i) v[t][i] += m[b + "attn_v.bias"].v[i];
      }
      if (s.qk_norm) {
        for (int h = 0; h < s.heads; ++h) {
          RmsNormInPlace(q[t], h * hd, hd, m[b + "attn_q_norm.weight"], s.eps);
        }
        for (int h = 0; h < s.kv_heads; ++h) {
          RmsNormInPlace(k[t], h * hd, hd, m[b + "attn_k_norm.weight"], s.eps);
        }
      }
      RopeInPlace(q[t], s.heads, hd, t, s, m);
      RopeInPlace(k[t], s.kv_heads, hd, t, s, m);
    }
    for (int t = 0; t < T; ++t) {
      std::vector<double> att(q_dim, 0.0);
      for (int h = 0; h < s.heads; ++h) {
        const int kvh = h / G;
        std::vector<double> score(t + 1);
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          double d = 0;
          for (int i = 0; i < hd; ++i) d += q[t][h * hd + i] * k[j][kvh * hd + i];
          score[j] = d / std::sqrt(double(hd));
          mx = std::max(mx, score[j]);
        }
        double sum = 0;
        for (double& e : score) sum += (e = std::exp(e - mx));
        for (int j = 0; j <= t; ++j) {
          for (int i = 0; i < hd; ++i) att[h * hd + i] += score[j] / sum * v[j][kvh * hd + i];
        }
      }
      const std::vector<double> o = MatVec(m[b + "attn_output.weight"], att);
      for (int i = 0; i < s.dim; ++i) x[t][i] += o[i];
      std::vector<double> xb = x[t];
      RmsNormInPlace(xb, 0, s.dim, m[b + "ffn_norm.weight"], s.eps);
      const std::vector<double> g = MatVec(m[b + "ffn_gate.weight"], xb);
      const std::vector<double> u = MatVec(m[b + "ffn_up.weight"], xb);
      std::vector<double> hb(s.hidden);
      for (int i = 0; i < s.hidden; ++i) hb[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      const std::vector<double> d = MatVec(m[b + "ffn_down.weight"], hb);
      for (int i = 0; i < s.dim; ++i) x[t][i] += d[i];
    }
  }
  std::vector<std::vector<double>> logits(T);
  for (int t = 0; t < T; ++t) {
    RmsNormInPlace(x[t], 0, s.dim, m["output_norm.weight"], s.eps);
    logits[t] = MatVec(m[s.tied ? "token_embd.weight" : "output.weight"], x[t]);
  }
  return logits;
}

// Loads the spec's model, runs a 24-token prompt through ModelRunner (two chunks, so the second
// attends to cached K/V) and returns the largest |logit - reference| over the logits' RMS.
// `reference` (default: s) is the spec the reference forward assumes, to show that a wrong one
// is far off.
double RelativeError(const Spec& s, Model* out_model = nullptr, const Spec* reference = nullptr) {
  TempDir dir;
  const std::string path = dir.File("m.gguf");
  const RandomModel ref = WriteModel(s, path);
  absl::StatusOr<Model> model = LoadModel(path);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return 1e9;
  std::vector<int32_t> tokens;
  for (int i = 0; i < 24; ++i) tokens.push_back((i * 7 + 3) % s.vocab);
  const std::vector<std::vector<double>> want =
      ReferenceForward(reference != nullptr ? *reference : s, ref, tokens);

  KvShape shape = KvShapeFor(model->config, 8);
  shape.element_bytes = 4;
  auto cache = *KvCache::Create(shape, 64);
  ModelRunner runner(*model, cache.get());
  SequenceKv kv;
  std::vector<std::vector<float>> got;
  for (int32_t start : {0, 16}) {
    const int32_t n = start == 0 ? 16 : 8;
    SequenceStep step{&kv, std::span<const int32_t>(tokens).subspan(start, n), start, true};
    absl::StatusOr<std::span<const float>> logits = runner.Forward({&step, 1});
    EXPECT_TRUE(logits.ok()) << logits.status();
    if (!logits.ok()) return 1e9;
    for (int32_t i = 0; i < n; ++i) {
      got.emplace_back(logits->begin() + int64_t(i) * s.vocab,
                       logits->begin() + int64_t(i + 1) * s.vocab);
    }
  }
  double err = 0, ss = 0;
  int64_t count = 0;
  for (size_t t = 0; t < want.size(); ++t) {
    for (int i = 0; i < s.vocab; ++i) {
      err = std::max(err, std::abs(got[t][i] - want[t][i]));
      ss += want[t][i] * want[t][i];
      ++count;
    }
  }
  if (out_model != nullptr) *out_model = *std::move(model);
  return err / std::sqrt(ss / count);
}

Spec Llama31() {
  Spec s;
  s.theta = 500000.0f;
  s.rope_freqs = true;
  return s;
}
Spec Qwen2() {
  Spec s;
  s.arch = "qwen2";
  s.theta = 1e6f;
  s.eps = 1e-6f;
  s.neox = s.bias = true;
  s.tied = true;
  return s;
}
Spec Qwen3() {
  Spec s;
  s.arch = "qwen3";
  s.theta = 1e6f;
  s.eps = 1e-6f;
  s.neox = s.qk_norm = true;
  s.head_size = 32;  // q_dim 128 at dim 64: wider than dim / heads
  s.tied = true;
  return s;
}

TEST(GgufArchTest, ConfigComesFromTheMetadata) {
  TempDir dir;
  WriteModel(Qwen3(), dir.File("q3.gguf"));
  absl::StatusOr<ModelConfig> c = ReadModelConfig(dir.File("q3.gguf"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, Architecture::kQwen3);
  EXPECT_EQ(c->rope_style, RopeStyle::kNeox);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->head_dim(), 32);
  EXPECT_EQ(c->q_dim(), 128);
  EXPECT_EQ(c->kv_dim(), 64);
  EXPECT_EQ(c->rope_theta, 1e6f);
  EXPECT_EQ(c->rms_norm_eps, 1e-6f);
  WriteModel(Qwen2(), dir.File("q2.gguf"));
  c = ReadModelConfig(dir.File("q2.gguf"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, Architecture::kQwen2);
  EXPECT_TRUE(c->attention_bias);
  EXPECT_EQ(c->rope_style, RopeStyle::kNeox);
  EXPECT_EQ(c->head_dim(), 16);
  WriteModel(Llama31(), dir.File("l3.gguf"));
  c = ReadModelConfig(dir.File("l3.gguf"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_style, RopeStyle::kInterleaved);
  EXPECT_TRUE(c->rope_freq_factors);
  EXPECT_EQ(c->rope_theta, 500000.0f);
}

// BOS / EOS ids and whether a prompt gets BOS come from the tokenizer keys; `run` honours them.
TEST(GgufArchTest, SpecialTokensComeFromTheMetadata) {
  TempDir dir;
  Spec s = Qwen2();
  s.bos = 7;
  s.eos = 9;
  s.add_bos = 0;
  WriteModel(s, dir.File("m.gguf"));
  absl::StatusOr<ModelConfig> c = ReadModelConfig(dir.File("m.gguf"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->bos_id, 7);
  EXPECT_EQ(c->eos_id, 9);
  EXPECT_FALSE(c->add_bos);
  int rc = 0;
  std::string out = testing::RunCapture(
      std::string(HEAVYKV_BINARY) + " run --model " + dir.File("m.gguf") +
          " --prompt '3 4' --steps 6 --temperature 0 --json 2>&1",
      &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("\"token_ids\":[3,4,"), std::string::npos) << out;  // no BOS in front
  s.add_bos = 1;
  WriteModel(s, dir.File("m.gguf"));
  out = testing::RunCapture(std::string(HEAVYKV_BINARY) + " run --model " + dir.File("m.gguf") +
                                " --prompt '3 4' --steps 6 --temperature 0 --json 2>&1",
                            &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("\"token_ids\":[7,3,4,"), std::string::npos) << out;
  // An id outside the vocabulary is a clear error.
  s.eos = 40;
  WriteModel(s, dir.File("m.gguf"));
  const absl::Status bad = ReadModelConfig(dir.File("m.gguf")).status();
  EXPECT_TRUE(absl::IsInvalidArgument(bad)) << bad;
  EXPECT_NE(bad.message().find("eos_token_id"), std::string::npos) << bad;
}

// fp32 arithmetic against double: the error is rounding only.
TEST(GgufArchTest, LlamaWithRopeFreqsMatchesTheReference) {
  EXPECT_LT(RelativeError(Llama31()), 1e-4);
  Spec plain;
  EXPECT_LT(RelativeError(plain), 1e-4);
}

TEST(GgufArchTest, Qwen2MatchesTheReference) { EXPECT_LT(RelativeError(Qwen2()), 1e-4); }

TEST(GgufArchTest, Qwen3MatchesTheReference) { EXPECT_LT(RelativeError(Qwen3()), 1e-4); }

// Head dims 64 and 128 (Llama 3, Qwen3) and GQA groups of 1, 4 and 8.
TEST(GgufArchTest, WideHeadsAndGroupSizesMatchTheReference) {
  for (auto [head_size, heads, kv_heads] : {std::tuple{128, 8, 1}, std::tuple{64, 8, 2},
                                            std::tuple{128, 4, 4}}) {
    Spec s = Qwen3();
    s.head_size = head_size;
    s.heads = heads;
    s.kv_heads = kv_heads;
    EXPECT_LT(RelativeError(s), 1e-4) << head_size << " " << heads << "/" << kv_heads;
  }
}

// The reference is sensitive to each trait: the same file read as another architecture (rope
// pairing, missing bias or norm) is far off, so the tests above cannot pass by accident.
TEST(GgufArchTest, TheReferenceTellsTheArchitecturesApart) {
  for (Spec s : {Qwen2(), Qwen3(), Llama31()}) {
    TempDir dir;
    const RandomModel m = WriteModel(s, dir.File("m.gguf"));
    std::vector<int32_t> tokens = {3, 10, 17, 24, 31, 38, 5, 12};
    const auto want = ReferenceForward(s, m, tokens);
    for (int variant = 0; variant < 3; ++variant) {
      Spec wrong = s;
      if (variant == 0) wrong.neox = !s.neox;
      if (variant == 1) wrong.bias = false, wrong.qk_norm = false, wrong.rope_freqs = false;
      if (variant == 2) wrong.theta = 10000.0f;
      if (variant == 1 && !s.bias && !s.qk_norm && !s.rope_freqs) continue;
      const auto other = ReferenceForward(wrong, m, tokens);
      double diff = 0, ss = 0;
      for (size_t t = 1; t < want.size(); ++t) {
        for (size_t i = 0; i < want[t].size(); ++i) {
          diff = std::max(diff, std::abs(want[t][i] - other[t][i]));
          ss += want[t][i] * want[t][i];
        }
      }
      EXPECT_GT(diff / std::sqrt(ss / (want.size() * want[0].size())), 1e-2)
          << s.arch << " variant " << variant;
    }
  }
}

// Quantized matrices: the runner's result is the reference on the dequantized weights, up to
// fp32 rounding and the 8-bit rounding of the activations that the quantized GEMM does, as
// llama.cpp's does (kernels/cpu/quant_gemm.h). These small random models amplify it through two
// layers: measured 0.05-0.12 of the logits' RMS as the largest single error; a wrong block layout,
// scale or rope pairing is off by the logits' own size (>= 0.5), so 0.25 tells them apart.
TEST(GgufArchTest, QuantizedMatricesMatchTheReference) {
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ5_0}) {
    for (Spec s : {Qwen2(), Qwen3(), Llama31()}) {
      s.matrix_type = type;
      Model model;
      EXPECT_LT(RelativeError(s, &model), 0.25) << s.arch << " " << GgmlTypeName(type);
      EXPECT_FALSE(model.layers[0].wqkv.IsPacked(cpu::WeightType::kFp32));
      Spec wrong = s;  // the same file against a reference with the other rope pairing
      wrong.neox = !s.neox;
      EXPECT_GT(RelativeError(s, nullptr, &wrong), 0.5) << s.arch << " " << GgmlTypeName(type);
    }
  }
}

// Weights stay quantized in memory: the Model holds at most 1.1x the file's tensor bytes (the
// norms, biases and rope factors are fp32 as in the file).
TEST(GgufArchTest, QuantizedWeightsStayQuantizedInMemory) {
  for (const char* name : {"rl256-q4_k_m.gguf", "rl256-q8_0.gguf", "rq256-q4_k_m.gguf",
                           "s260-q6_k.gguf", "rl256-q4_0.gguf"}) {
    const std::string path = testing::SourcePath(std::string("tests/data/gguf/") + name);
    absl::StatusOr<GgufFile> f = GgufFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status();
    int64_t file_bytes = 0;
    for (const GgufTensor& t : f->tensors()) file_bytes += int64_t(t.data.size());
    absl::StatusOr<Model> m = LoadModel(path);
    ASSERT_TRUE(m.ok()) << m.status();
    const int64_t held = m->HeldBytes();
    EXPECT_LE(held, file_bytes * 11 / 10) << name;
    EXPECT_GE(held, file_bytes * 9 / 10) << name;  // nothing was dropped either
    // LoadModel leaves quantized matrices in the file's mapping (nothing copied), and the model
    // keeps the mapping open after the GgufFile above and LoadModel's own are gone.
    const auto* down = std::get_if<cpu::QuantMatrix>(&m->layers[1].w2.parts().front());
    ASSERT_NE(down, nullptr) << name;
    EXPECT_TRUE(down->is_view()) << name;
    std::vector<float> row(down->cols());
    down->DequantizeRowTo(down->rows() - 1, row.data());
  }
}

// Views join only where one ends where the next begins; owned matrices are copied together.
TEST(GgufArchTest, QuantViewsJoinOnlyWhenAdjacent) {
  auto bytes = std::make_shared<std::vector<uint8_t>>(4 * 34, 0);
  for (size_t i = 0; i < bytes->size(); ++i) (*bytes)[i] = uint8_t(i * 7);
  auto view = [&](int64_t first_row, int64_t rows) {
    return *cpu::QuantMatrix::View(cpu::QuantType::kQ8_0, rows, 32, bytes->data() + first_row * 34,
                                   rows * 34, bytes);
  };
  cpu::Linear lin(view(0, 1));
  ASSERT_TRUE(lin.Append(view(1, 2)).ok());  // adjacent: one part of 3 rows
  EXPECT_EQ(lin.parts().size(), 1u);
  ASSERT_TRUE(lin.Append(view(0, 1)).ok());  // not adjacent: a second part, nothing copied
  EXPECT_EQ(lin.parts().size(), 2u);
  EXPECT_EQ(lin.rows(), 4);
  std::vector<float> a(32), b(32);
  lin.Row(3, a.data());
  lin.Row(0, b.data());
  EXPECT_EQ(a, b);
  cpu::Linear owned(*cpu::QuantMatrix::FromRows(cpu::QuantType::kQ8_0, 1, 32, bytes->data(), 34));
  ASSERT_TRUE(owned.Append(*cpu::QuantMatrix::FromRows(cpu::QuantType::kQ8_0, 1, 32,
                                                       bytes->data() + 68, 34)).ok());
  EXPECT_EQ(owned.parts().size(), 1u);  // copied into one
  EXPECT_EQ(owned.rows(), 2);
}

}  // namespace
}  // namespace heavykv
