// Checkpoint loading: the bundled model's header, rejection of broken files, make-model shapes.
#include "engine/model/model.h"
#include "kernels/bf16.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "engine/model/make_model.h"
#include "tests/test_util.h"

namespace heavykv {
namespace {

using testing::ModelPath;
using testing::TempDir;

std::vector<char> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

void WriteAll(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
}

TEST(ModelTest, LoadsBundledModelHeader) {
  absl::StatusOr<Model> m = LoadModel(ModelPath());
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelConfig& c = m->config;
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.group_size(), 2);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.seq_len, 512);
  EXPECT_TRUE(c.shared_classifier);
  EXPECT_TRUE(m->embedding.empty());  // rows come from the shared classifier
}

// Every fused, packed matrix read back equals the checkpoint's tensors, in the fused order; with
// bf16 weights, the tensors rounded to bf16 (nearest even).
TEST(ModelTest, FusedMatricesHoldTheCheckpointTensors) {
  for (cpu::WeightType type : {cpu::WeightType::kFp32, cpu::WeightType::kBf16}) {
  const bool bf16 = type == cpu::WeightType::kBf16;
  SCOPED_TRACE(bf16 ? "bf16 weights" : "fp32 weights");
  absl::StatusOr<Model> m = LoadModel(ModelPath(), type);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->classifier.IsPacked(type));
  const ModelConfig& c = m->config;
  const int64_t d = c.dim, kv = c.kv_dim(), hid = c.hidden_dim, L = c.num_layers;
  const std::vector<char> raw = ReadAll(ModelPath());
  // Tensors in file order, each for all layers: name -> floats per layer.
  int64_t offset = 28 / 4;
  auto next = [&](int64_t per_layer, int64_t layers) {
    const int64_t at = offset;
    offset += per_layer * layers;
    return at;
  };
  const int64_t emb = next(c.vocab_size * d, 1);
  next(d, L);  // rms_att
  const int64_t wq = next(d * d, L), wk = next(kv * d, L), wv = next(kv * d, L);
  const int64_t wo = next(d * d, L);
  next(d, L);  // rms_ffn
  const int64_t w1 = next(hid * d, L), w2 = next(d * hid, L), w3 = next(hid * d, L);
  auto file = [&](int64_t at, int64_t n) {
    std::vector<float> v(n);
    std::memcpy(v.data(), raw.data() + at * 4, n * 4);
    if (bf16) {
      for (float& x : v) x = Bf16ToFloat(FloatToBf16(x));
    }
    return v;
  };
  auto unpack = [](const cpu::Linear& p) {
    std::vector<float> v(p.rows() * p.cols());
    p.ToRowMajor(v.data());
    return v;
  };
  auto concat = [](std::vector<std::vector<float>> parts) {
    std::vector<float> v;
    for (const auto& p : parts) v.insert(v.end(), p.begin(), p.end());
    return v;
  };
  const int64_t l = 3;  // not layer 0, so per-layer offsets are exercised
  const LayerWeights& w = m->layers[l];
  EXPECT_EQ(unpack(w.wqkv), concat({file(wq + l * d * d, d * d), file(wk + l * kv * d, kv * d),
                                    file(wv + l * kv * d, kv * d)}));
  EXPECT_EQ(unpack(w.wo), file(wo + l * d * d, d * d));
  EXPECT_EQ(unpack(w.w13), concat({file(w1 + l * hid * d, hid * d), file(w3 + l * hid * d, hid * d)}));
  EXPECT_EQ(unpack(w.w2), file(w2 + l * d * hid, d * hid));
  EXPECT_EQ(unpack(m->classifier), file(emb, c.vocab_size * d));
  std::vector<float> row(d);
  m->EmbedToken(300, row.data());
  EXPECT_EQ(row, file(emb + 300 * d, d));
  // Bytes a step streams: every matrix once (the shared classifier included), norms in fp32.
  const int64_t matrix_params = c.NumParams() - 2 * d * L - d;
  EXPECT_EQ(m->WeightBytes(), matrix_params * (bf16 ? 2 : 4) + (2 * d * L + d) * 4);
  }
  EXPECT_EQ(ParseWeightDtype("auto").value(), cpu::WeightType::kFp32);
  EXPECT_EQ(ParseWeightDtype("bf16").value(), cpu::WeightType::kBf16);
  EXPECT_EQ(ParseWeightDtype("fp8").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelTest, RejectsMissingTruncatedAndTrailingFiles) {
  TempDir dir;
  EXPECT_TRUE(absl::IsNotFound(LoadModel(dir.File("nope.bin")).status()));

  std::vector<char> raw = ReadAll(ModelPath());
  std::vector<char> cut(raw.begin(), raw.end() - 100);
  WriteAll(dir.File("cut.bin"), cut);
  absl::Status s = LoadModel(dir.File("cut.bin")).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("truncated"), absl::string_view::npos) << s;

  std::vector<char> longer = raw;
  longer.resize(raw.size() + 8, 0);
  WriteAll(dir.File("long.bin"), longer);
  s = LoadModel(dir.File("long.bin")).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("trailing"), absl::string_view::npos) << s;

  WriteAll(dir.File("tiny.bin"), std::vector<char>(raw.begin(), raw.begin() + 10));
  EXPECT_TRUE(absl::IsInvalidArgument(LoadModel(dir.File("tiny.bin")).status()));
}

TEST(ModelTest, RejectsInconsistentHeader) {
  TempDir dir;
  std::vector<char> raw = ReadAll(ModelPath());
  int32_t heads = 3;  // 8 query heads -> 3: neither divides dim 64 nor is a multiple of 4 kv heads
  std::memcpy(raw.data() + 12, &heads, 4);
  WriteAll(dir.File("bad.bin"), raw);
  absl::Status s = LoadModel(dir.File("bad.bin")).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("inconsistent header"), absl::string_view::npos) << s;

  int32_t zero = 0;
  raw = ReadAll(ModelPath());
  std::memcpy(raw.data() + 8, &zero, 4);  // n_layers 0
  WriteAll(dir.File("zero.bin"), raw);
  EXPECT_TRUE(absl::IsInvalidArgument(LoadModel(dir.File("zero.bin")).status()));
}

// A checkpoint holding only a header: dim, hidden_dim, n_layers, n_heads, n_kv_heads,
// vocab_size, seq_len.
std::string WriteHeader(const TempDir& dir, const std::string& name, std::vector<int32_t> h) {
  const std::string path = dir.File(name);
  std::vector<char> bytes(h.size() * sizeof(int32_t));
  std::memcpy(bytes.data(), h.data(), bytes.size());
  WriteAll(path, bytes);
  return path;
}

// Checks that both ReadModelConfig and LoadModel reject the header with `message`.
void ExpectRejected(const std::string& path, absl::string_view message) {
  for (const absl::Status& s : {ReadModelConfig(path).status(), LoadModel(path).status()}) {
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find(message), absl::string_view::npos) << s;
    EXPECT_NE(s.message().find(path), absl::string_view::npos) << s;
  }
}

TEST(ModelTest, RejectsVocabSizeWithoutMagnitude) {
  // llama2.c's negative vocab_size means "separate classifier"; INT32_MIN cannot be negated.
  TempDir dir;
  const int32_t min = std::numeric_limits<int32_t>::min();
  ExpectRejected(WriteHeader(dir, "vocab_min.bin", {64, 172, 5, 8, 4, min, 512}),
                 "vocab_size -2147483648 cannot be valid");
  // Its neighbour negates fine, and is then too large a vocabulary for this dim.
  ExpectRejected(WriteHeader(dir, "vocab_min1.bin", {1024, 172, 5, 8, 4, min + 1, 512}),
                 "implausibly large");
  ExpectRejected(WriteHeader(dir, "vocab_zero.bin", {64, 172, 5, 8, 4, 0, 512}),
                 "every field must be positive");
  // A plain separate-classifier header is valid; this file is only too short for it.
  const std::string neg = WriteHeader(dir, "vocab_neg.bin", {64, 172, 5, 8, 4, -512, 512});
  absl::StatusOr<ModelConfig> c = ReadModelConfig(neg);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vocab_size, 512);
  EXPECT_FALSE(c->shared_classifier);
  const absl::Status s = LoadModel(neg).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("truncated"), absl::string_view::npos) << s;
}

TEST(ModelTest, RejectsHeadersWhoseSizesOverflow) {
  TempDir dir;
  const int32_t max = std::numeric_limits<int32_t>::max();
  // dim 2^20 in 1024 heads of 1024: every field plausible, but 2^31 layers of ~2^42 floats each
  // overflow the checkpoint's int64 byte count.
  ExpectRejected(WriteHeader(dir, "layers.bin", {1 << 20, 1, max, 1024, 1024, 1, 1}),
                 "checkpoint size overflows int64");
  // 2^31 positions of 1024-float RoPE rows fit int64, but 2^41 parameters are past the
  // plausibility bound (2^40).
  ExpectRejected(WriteHeader(dir, "seq.bin", {1 << 20, 1, 1, 1024, 1024, 1, max}),
                 "implausibly large");
  // dim 2^30 (2^20 heads of 1024) with as many kv heads: qkv_dim = 3 * 2^30 is not an int32,
  // and 2 * dim * dim alone is 2^61.
  ExpectRejected(WriteHeader(dir, "qkv.bin", {1 << 30, 1, 1, 1 << 20, 1 << 20, 1, 1}),
                 "does not fit an int32");
  // 2 * hidden_dim rows of w1|w3 must be an int32 too.
  ExpectRejected(WriteHeader(dir, "hidden.bin", {2, max, 1, 1, 1, 1, 1}),
                 "does not fit an int32");
}

// A negative vocab_size means a separate classifier; INT32_MIN has no positive counterpart (its
// negation was undefined behaviour, caught by UBSan in the sanitizer build).
TEST(ModelTest, RejectsMostNegativeVocabSize) {
  TempDir dir;
  std::vector<char> raw = ReadAll(ModelPath());
  int32_t vocab = std::numeric_limits<int32_t>::min();
  std::memcpy(raw.data() + 20, &vocab, 4);
  WriteAll(dir.File("vocab.bin"), raw);
  for (const absl::Status& s : {LoadModel(dir.File("vocab.bin")).status(),
                                ReadModelConfig(dir.File("vocab.bin")).status()}) {
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find("vocab_size -2147483648"), absl::string_view::npos) << s;
  }
}

// Each field passes its own checks, but the parameter count overflows int64 (UBSan found the
// overflow in NumParams; without the UB the wrapped size could match a small file).
TEST(ModelTest, RejectsHeaderWhoseParameterCountOverflows) {
  TempDir dir;
  const int32_t header[7] = {1 << 20, 1, 4, 1024, 1024, 1, 1};
  std::vector<char> raw(sizeof(header) + 64, 0);
  std::memcpy(raw.data(), header, sizeof(header));
  WriteAll(dir.File("huge.bin"), raw);
  for (const absl::Status& s : {LoadModel(dir.File("huge.bin")).status(),
                                ReadModelConfig(dir.File("huge.bin")).status()}) {
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find("implausibly large"), absl::string_view::npos) << s;
  }
}

TEST(ModelTest, MakeModelRoundTripsWithSeparateClassifier) {
  TempDir dir;
  ModelConfig c = testing::SmallGqaConfig();
  ASSERT_TRUE(WriteRandomModel(c, 7, dir.File("m.bin")).ok());
  absl::StatusOr<Model> m = LoadModel(dir.File("m.bin"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->config.num_kv_heads, 2);
  EXPECT_FALSE(m->config.shared_classifier);
  ASSERT_EQ(m->embedding.rows(), 300);
  ASSERT_EQ(m->embedding.cols(), 64);
  EXPECT_EQ(m->classifier.rows(), 300);
  // A separate classifier: the embedding row and the classifier row of a token differ.
  std::vector<float> emb(64), cls(64);
  m->EmbedToken(5, emb.data());
  m->classifier.Row(5, cls.data());
  EXPECT_NE(emb, cls);
  EXPECT_EQ(std::filesystem::file_size(dir.File("m.bin")),
            28 + 4 * (c.NumParams() + int64_t(c.seq_len) * c.head_dim()));
  // Same seed, same bytes; another seed, other weights.
  ASSERT_TRUE(WriteRandomModel(c, 7, dir.File("m2.bin")).ok());
  ASSERT_TRUE(WriteRandomModel(c, 8, dir.File("m3.bin")).ok());
  EXPECT_EQ(ReadAll(dir.File("m.bin")), ReadAll(dir.File("m2.bin")));
  EXPECT_NE(ReadAll(dir.File("m.bin")), ReadAll(dir.File("m3.bin")));
}

TEST(ModelTest, NamedShapes) {
  absl::StatusOr<ModelConfig> s = NamedShape("stories110M");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->dim, 768);
  EXPECT_EQ(s->num_layers, 12);
  EXPECT_EQ(s->seq_len, 1024);
  EXPECT_NEAR(s->NumParams() / 1e6, 110.0, 2.0);
  absl::StatusOr<ModelConfig> l = NamedShape("llama3-1b");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->num_heads, 32);
  EXPECT_EQ(l->num_kv_heads, 8);
  EXPECT_EQ(l->vocab_size, 128256);
  EXPECT_TRUE(absl::IsInvalidArgument(NamedShape("gpt5").status()));
}

}  // namespace
}  // namespace heavykv
