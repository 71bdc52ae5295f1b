// Checkpoint loading: the bundled model's header, rejection of broken files, make-model shapes.
#include "engine/model.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "engine/make_model.h"
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
  EXPECT_EQ(m->classifier(), m->embedding.data());
  // The fused q|k|v matrix holds wq's rows first: its first row equals the checkpoint's wq[0].
  std::vector<char> raw = ReadAll(ModelPath());
  const int64_t wq_offset = 28 + 4 * (int64_t(512) * 64 + 5 * 64);
  float first;
  std::memcpy(&first, raw.data() + wq_offset, 4);
  EXPECT_EQ(m->layers[0].wqkv[0], first);
  EXPECT_EQ(m->layers[0].wqkv.size(), size_t(64 + 2 * 32) * 64);
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

TEST(ModelTest, MakeModelRoundTripsWithSeparateClassifier) {
  TempDir dir;
  ModelConfig c = testing::SmallGqaConfig();
  ASSERT_TRUE(WriteRandomModel(c, 7, dir.File("m.bin")).ok());
  absl::StatusOr<Model> m = LoadModel(dir.File("m.bin"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->config.num_kv_heads, 2);
  EXPECT_FALSE(m->config.shared_classifier);
  ASSERT_EQ(m->classifier_storage.size(), size_t(300) * 64);
  EXPECT_NE(m->classifier(), m->embedding.data());
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
