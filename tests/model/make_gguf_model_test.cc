// make-model --format gguf (engine/model/make_gguf_model.h, engine/gguf/gguf_weight_mix.h): the
// per-tensor weight types agree with the files llama-quantize made (tests/data/gguf); small models
// of each architecture and weight type reopen with the metadata llama.cpp's converters write, the
// planned tensor names, shapes and types, and values within quantization error of the drawn ones;
// the seed decides the bytes; --vocab-from copies the vocabulary; heavykv loads what it runs; the
// command refuses unknown architectures and types with a message.
#include "engine/model/make_gguf_model.h"

#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "engine/gguf/gguf.h"
#include "engine/gguf/gguf_weight_mix.h"
#include "engine/model/gguf_model.h"
#include "engine/model/make_model.h"
#include "engine/tokenizer/gguf_tokenizer.h"
#include "gtest/gtest.h"
#include "kernels/cpu/quant_types.h"
#include "tests/test_util.h"

namespace heavykv {
namespace {

using ::heavykv::testing::ReadFile;
using ::heavykv::testing::RunCapture;
using ::heavykv::testing::SourcePath;
using ::heavykv::testing::TempDir;

// The block a tensor name belongs to ("blk.7.ffn_down.weight" -> 7), -1 outside the blocks.
int32_t LayerOf(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "blk.")) return -1;
  int32_t layer = -1;
  return absl::SimpleAtoi(name.substr(0, name.find('.')), &layer) ? layer : -1;
}

// A small model: rows of 256 (K-quant blocks fit) except ffn_down's 320 (they do not); three
// layers, so that use_more_bits picks one (the last) and leaves two.
ModelConfig SmallConfig(Architecture arch) {
  ModelConfig c;
  c.dim = 256;
  c.hidden_dim = 320;
  c.num_layers = 3;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.vocab_size = 300;
  c.seq_len = 128;
  SetArchitecture(arch, &c);
  if (arch == Architecture::kQwen3) c.head_size = 64;  // q_dim 512, wider than dim
  return c;
}

// sqrt(mean square) of the dequantized values' error over the tensor, over its scale.
double RelativeRmsError(const GgufTensor& t, const RandomTensorPlan& plan, uint64_t seed) {
  const cpu::QuantType q = *cpu::QuantTypeFromGgmlId(static_cast<uint32_t>(t.type));
  const int64_t cols = t.dims[0], rows = t.num_elements / cols;
  const int64_t row_bytes = cpu::QuantRowBytes(q, cols);
  std::vector<float> want(cols), have(cols);
  double sum = 0;
  for (int64_t r = 0; r < rows; ++r) {
    DrawRandomRow(plan, seed, r, want.data());
    cpu::DequantizeRow(q, t.data.data() + r * row_bytes, have.data(), cols);
    for (int64_t i = 0; i < cols; ++i) sum += double(have[i] - want[i]) * (have[i] - want[i]);
  }
  return std::sqrt(sum / double(t.num_elements)) / plan.scale;
}

// The largest RelativeRmsError each type may show on uniform values (measured: about a third).
double Tolerance(GgmlType t) {
  switch (t) {
    case GgmlType::kF32:
      return 0;
    case GgmlType::kF16:
      return 1e-3;
    case GgmlType::kBF16:
      return 5e-3;
    case GgmlType::kQ8_0:
      return 0.01;
    case GgmlType::kQ6_K:
      return 0.02;
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_K:
      return 0.04;
    default:
      return 0.08;
  }
}

TEST(GgufWeightMixTest, ParsesNamesAndRefusesOthers) {
  absl::StatusOr<GgufWeightMix> m = ParseGgufWeightMix("Q4_K_M");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->base, GgmlType::kQ4_K);
  EXPECT_EQ(m->file_type, 15u);
  EXPECT_EQ(ParseGgufWeightMix("q5_k_m")->file_type, 17u);
  EXPECT_EQ(ParseGgufWeightMix("bf16")->file_type, 32u);
  absl::StatusOr<GgufWeightMix> bad = ParseGgufWeightMix("q3_k_s");
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "q4_k_m")) << bad.status();
}

// Every matrix of the files llama-quantize made gets the type GgufTensorType gives it: the mix
// rules (rl256: Q6_K classifier, attn_v and ffn_down of layer 1 of 2) and the fallbacks for rows
// of 64 and 172 (s260: Q5_0, Q8_0, F16).
TEST(GgufWeightMixTest, MatchesLlamaQuantizeOnFixtures) {
  for (const auto& [file, mix_name] :
       {std::pair<const char*, const char*>{"rl256-q4_k_m.gguf", "q4_k_m"},
        {"rl256-q5_k_m.gguf", "q5_k_m"},
        {"rl256-q6_k.gguf", "q6_k"},
        {"rl256-q8_0.gguf", "q8_0"},
        {"s260-q4_k_m.gguf", "q4_k_m"},
        {"s260-q6_k.gguf", "q6_k"}}) {
    SCOPED_TRACE(file);
    absl::StatusOr<GgufFile> f = GgufFile::Open(SourcePath(std::string("tests/data/gguf/") + file));
    ASSERT_TRUE(f.ok()) << f.status();
    const GgufWeightMix mix = *ParseGgufWeightMix(mix_name);
    const int32_t layers = static_cast<int32_t>(*f->GetU32("llama.block_count"));
    const bool has_output = f->FindTensor("output.weight") != nullptr;
    int checked = 0;
    for (const GgufTensor& t : f->tensors()) {
      const GgmlType want = t.type;
      EXPECT_EQ(GgufTensorType(mix, {t.name, t.shape(), LayerOf(t.name), layers, has_output}),
                want)
          << t.name << " is " << GgmlTypeName(want);
      ++checked;
    }
    EXPECT_GT(checked, 20);
  }
}

// The real qwen2.5-0.5b's rows of 896 take llama.cpp's fallbacks: Q5_0 for Q4_K, Q8_0 for the
// Q6_K picks and the tied classifier; ffn_down's rows of 4864 stay K-quants.
TEST(GgufWeightMixTest, Qwen25HalfBillionFallbacks) {
  const ModelConfig c = *NamedShape("qwen2.5-0.5b");
  const std::vector<RandomTensorPlan> plan =
      PlanRandomGgufTensors(c, *ParseGgufWeightMix("q4_k_m"));
  auto type_of = [&](const std::string& name) {
    for (const RandomTensorPlan& t : plan) {
      if (t.name == name) return t.type;
    }
    ADD_FAILURE() << name << " is not planned";
    return GgmlType::kI8;
  };
  EXPECT_EQ(type_of("token_embd.weight"), GgmlType::kQ8_0);
  EXPECT_EQ(type_of("blk.0.attn_q.weight"), GgmlType::kQ5_0);
  EXPECT_EQ(type_of("blk.0.attn_v.weight"), GgmlType::kQ8_0);  // use_more_bits(0, 24)
  EXPECT_EQ(type_of("blk.3.attn_v.weight"), GgmlType::kQ5_0);
  EXPECT_EQ(type_of("blk.0.ffn_down.weight"), GgmlType::kQ6_K);
  EXPECT_EQ(type_of("blk.3.ffn_down.weight"), GgmlType::kQ4_K);
  EXPECT_EQ(type_of("blk.5.ffn_down.weight"), GgmlType::kQ6_K);  // (5 - 3) % 3 == 2
  EXPECT_EQ(type_of("blk.0.attn_q.bias"), GgmlType::kF32);
}

TEST(MakeGgufModelTest, NamedShapes) {
  const ModelConfig l1 = *NamedShape("llama3.2-1b");
  EXPECT_TRUE(l1.shared_classifier);
  EXPECT_EQ(l1.rope_theta, 500000.0f);
  EXPECT_NEAR(l1.NumParams() / 1e9, 1.236, 0.001);
  const ModelConfig l8 = *NamedShape("llama3-8b");
  EXPECT_FALSE(l8.shared_classifier);
  EXPECT_NEAR(l8.NumParams() / 1e9, 8.030, 0.001);
  const ModelConfig q2 = *NamedShape("qwen2.5-0.5b");
  EXPECT_EQ(q2.arch, Architecture::kQwen2);
  EXPECT_EQ(q2.rope_style, RopeStyle::kNeox);
  EXPECT_TRUE(q2.attention_bias);
  EXPECT_NEAR(q2.NumParams() / 1e9, 0.494, 0.001);
  const ModelConfig q3 = *NamedShape("qwen3-0.6b");
  EXPECT_EQ(q3.arch, Architecture::kQwen3);
  EXPECT_EQ(q3.q_dim(), 2048);
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_NEAR(q3.NumParams() / 1e9, 0.596, 0.001);
}

// Each architecture with each weight type: the metadata, the tensors and their values.
TEST(MakeGgufModelTest, WritesEachArchitectureAndType) {
  TempDir dir;
  const std::vector<const char*> all_types = {"f32",  "f16",  "bf16", "q8_0",   "q4_0",  "q5_0",
                                              "q4_k", "q5_k", "q6_k", "q4_k_m", "q5_k_m"};
  for (Architecture arch : {Architecture::kLlama, Architecture::kQwen2, Architecture::kQwen3}) {
    // Types are architecture-blind: every one with llama, a few with the others.
    const std::vector<const char*> types =
        arch == Architecture::kLlama ? all_types : std::vector<const char*>{"bf16", "q4_k_m"};
    for (const char* type : types) {
      const std::string a = ArchitectureName(arch);
      SCOPED_TRACE(a + " " + type);
      RandomGgufOptions o;
      o.config = SmallConfig(arch);
      o.config.shared_classifier = arch != Architecture::kLlama;
      o.weights = *ParseGgufWeightMix(type);
      o.seed = 7;
      o.name = "tiny";
      const std::string path = dir.File(a + "-" + type + ".gguf");
      absl::StatusOr<ModelConfig> written = WriteRandomGgufModel(o, path);
      ASSERT_TRUE(written.ok()) << written.status();
      absl::StatusOr<GgufFile> f = GgufFile::Open(path);
      ASSERT_TRUE(f.ok()) << f.status();

      EXPECT_EQ(*f->GetString("general.architecture"), a);
      EXPECT_EQ(*f->GetString("general.name"), "tiny");
      EXPECT_EQ(*f->GetU32("general.file_type"), o.weights.file_type);
      EXPECT_EQ(*f->GetU32("general.quantization_version"), 2u);
      EXPECT_EQ(f->alignment(), 32u);
      EXPECT_EQ(f->FindMetadata("general.alignment"), nullptr);
      for (const auto& [key, want] : {std::pair<std::string, uint32_t>{".block_count", 3},
                                      {".context_length", 128},
                                      {".embedding_length", 256},
                                      {".feed_forward_length", 320},
                                      {".attention.head_count", 8},
                                      {".attention.head_count_kv", 2}}) {
        EXPECT_EQ(*f->GetU32(a + key), want) << key;
      }
      EXPECT_EQ(*f->GetF32(a + ".rope.freq_base"), 10000.0f);
      EXPECT_EQ(*f->GetF32(a + ".attention.layer_norm_rms_epsilon"), 1e-5f);
      const bool qwen3 = arch == Architecture::kQwen3;
      EXPECT_EQ(f->FindMetadata(a + ".attention.key_length") != nullptr, qwen3);
      if (qwen3) {
        EXPECT_EQ(*f->GetU32(a + ".attention.value_length"), 64u);
      }
      const bool llama = arch == Architecture::kLlama;
      EXPECT_EQ(f->FindMetadata(a + ".rope.dimension_count") != nullptr, llama);
      if (llama) {
        EXPECT_EQ(*f->GetU32("llama.vocab_size"), 300u);
      }
      EXPECT_EQ(*f->GetString("tokenizer.ggml.model"), "llama");
      EXPECT_EQ(f->GetArrayString("tokenizer.ggml.tokens")->size(), 300u);
      EXPECT_EQ(f->GetArrayI64("tokenizer.ggml.token_type")->size(), 300u);

      const std::vector<RandomTensorPlan> plan = PlanRandomGgufTensors(*written, o.weights);
      ASSERT_EQ(f->tensors().size(), plan.size());
      for (size_t i = 0; i < plan.size(); ++i) {
        const GgufTensor& t = f->tensors()[i];
        SCOPED_TRACE(plan[i].name);
        EXPECT_EQ(t.name, plan[i].name);
        EXPECT_EQ(std::vector<int64_t>(t.shape().begin(), t.shape().end()), plan[i].dims);
        EXPECT_EQ(t.type, plan[i].type);
        EXPECT_EQ(t.type == GgmlType::kF32, t.num_dims == 1 || o.weights.base == GgmlType::kF32);
        EXPECT_LE(RelativeRmsError(t, plan[i], o.seed), Tolerance(t.type));
        const bool spot_check = o.weights.base == GgmlType::kF32 || o.weights.mostly;
        if (spot_check && !plan[i].constant && t.num_dims == 2) {  // not any other values
          EXPECT_GT(RelativeRmsError(t, plan[i], o.seed + 1), 0.5);
        }
      }
      const bool tied = o.config.shared_classifier;
      EXPECT_EQ(f->FindTensor("output.weight") == nullptr, tied);
      EXPECT_EQ(f->FindTensor("blk.2.attn_q.bias") != nullptr, arch == Architecture::kQwen2);
      if (qwen3) {
        ASSERT_NE(f->FindTensor("blk.1.attn_k_norm.weight"), nullptr);
        EXPECT_EQ(f->FindTensor("blk.1.attn_k_norm.weight")->dims[0], 64);
        EXPECT_EQ(f->FindTensor("blk.1.attn_q.weight")->dims[1], 512);
        EXPECT_EQ(f->FindTensor("blk.1.attn_output.weight")->dims[0], 512);
      }
      if (std::string(type) == "q4_k_m") {
        // The classifier Q6_K; use_more_bits picks layer 2 of 3 for attn_v and ffn_down; the
        // rows of 320 of ffn_down fall back (Q4_K -> Q5_0, Q6_K -> Q8_0).
        const char* classifier = tied ? "token_embd.weight" : "output.weight";
        EXPECT_EQ(f->FindTensor(classifier)->type, GgmlType::kQ6_K);
        if (!tied) {
          EXPECT_EQ(f->FindTensor("token_embd.weight")->type, GgmlType::kQ4_K);
        }
        EXPECT_EQ(f->FindTensor("blk.0.ffn_down.weight")->type, GgmlType::kQ5_0);
        EXPECT_EQ(f->FindTensor("blk.2.ffn_down.weight")->type, GgmlType::kQ8_0);
        EXPECT_EQ(f->FindTensor("blk.0.attn_v.weight")->type, GgmlType::kQ4_K);
        EXPECT_EQ(f->FindTensor("blk.1.attn_v.weight")->type, GgmlType::kQ4_K);
        EXPECT_EQ(f->FindTensor("blk.2.attn_v.weight")->type, GgmlType::kQ6_K);
        EXPECT_EQ(f->FindTensor("blk.1.attn_q.weight")->type, GgmlType::kQ4_K);
      }
    }
  }
}

TEST(MakeGgufModelTest, SeedDecidesTheBytes) {
  TempDir dir;
  RandomGgufOptions o;
  o.config = SmallConfig(Architecture::kQwen2);
  o.weights = *ParseGgufWeightMix("q4_k_m");
  ASSERT_TRUE(WriteRandomGgufModel(o, dir.File("a.gguf")).ok());
  ASSERT_TRUE(WriteRandomGgufModel(o, dir.File("b.gguf")).ok());
  o.seed = 2;
  ASSERT_TRUE(WriteRandomGgufModel(o, dir.File("c.gguf")).ok());
  const std::string a = ReadFile(dir.File("a.gguf"));
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, ReadFile(dir.File("b.gguf")));
  const std::string c = ReadFile(dir.File("c.gguf"));
  EXPECT_EQ(a.size(), c.size());
  EXPECT_NE(a, c);
}

// --vocab-from: every tokenizer.* key copied byte for byte, the vocabulary size its token count.
TEST(MakeGgufModelTest, CopiesTheVocabulary) {
  TempDir dir;
  const std::string source = SourcePath("tests/data/gguf/s260-f32.gguf");
  RandomGgufOptions o;
  o.config = SmallConfig(Architecture::kLlama);
  o.weights = *ParseGgufWeightMix("f16");
  o.vocab_from = source;
  absl::StatusOr<ModelConfig> written = WriteRandomGgufModel(o, dir.File("v.gguf"));
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->vocab_size, 512);
  absl::StatusOr<GgufFile> f = GgufFile::Open(dir.File("v.gguf"));
  ASSERT_TRUE(f.ok()) << f.status();
  absl::StatusOr<GgufFile> src = GgufFile::Open(source);
  ASSERT_TRUE(src.ok());
  int copied = 0;
  for (const GgufMetadata& m : src->metadata()) {
    if (!absl::StartsWith(m.key, "tokenizer.")) continue;
    const GgufMetadata* got = f->FindMetadata(m.key);
    ASSERT_NE(got, nullptr) << m.key;
    EXPECT_EQ(got->type, m.type);
    EXPECT_EQ(got->count, m.count);
    EXPECT_TRUE(std::equal(got->raw.begin(), got->raw.end(), m.raw.begin(), m.raw.end())) << m.key;
    ++copied;
  }
  EXPECT_GE(copied, 7);
  EXPECT_EQ(f->FindTensor("token_embd.weight")->dims[1], 512);
  EXPECT_EQ(*f->GetU32("llama.vocab_size"), 512u);

  o.vocab_from = dir.File("missing.gguf");
  EXPECT_TRUE(absl::IsNotFound(WriteRandomGgufModel(o, dir.File("w.gguf")).status()));
  o.vocab_from.clear();
  o.config.vocab_size = 100;  // under the minimal vocabulary's 259 pieces
  EXPECT_TRUE(absl::IsInvalidArgument(WriteRandomGgufModel(o, dir.File("w.gguf")).status()));
}

// heavykv loads what make-model writes, each architecture with a quantized mix, and reads back
// the config it was written with; the minimal vocabulary loads as a tokenizer.
TEST(MakeGgufModelTest, HeavykvLoadsEachArchitecture) {
  TempDir dir;
  for (Architecture arch : {Architecture::kLlama, Architecture::kQwen2, Architecture::kQwen3}) {
    SCOPED_TRACE(ArchitectureName(arch));
    RandomGgufOptions o;
    o.config = SmallConfig(arch);
    o.config.shared_classifier = arch != Architecture::kLlama;
    o.weights = *ParseGgufWeightMix(arch == Architecture::kQwen2 ? "bf16" : "q4_k_m");
    const std::string path = dir.File("m.gguf");
    ASSERT_TRUE(WriteRandomGgufModel(o, path).ok());
    absl::StatusOr<GgufFile> f = GgufFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status();
    absl::StatusOr<Model> m = LoadGgufModel(*f, cpu::WeightType::kFp32);
    ASSERT_TRUE(m.ok()) << m.status();
    const ModelConfig& c = m->config;
    EXPECT_EQ(c.arch, arch);
    EXPECT_EQ(c.rope_style, o.config.rope_style);
    EXPECT_EQ(c.head_dim(), o.config.head_dim());
    EXPECT_EQ(c.attention_bias, o.config.attention_bias);
    EXPECT_EQ(c.qk_norm, o.config.qk_norm);
    EXPECT_EQ(c.vocab_size, 300);
    EXPECT_EQ(c.shared_classifier, o.config.shared_classifier);
    absl::StatusOr<Tokenizer> tok = LoadGgufTokenizer(*f, c.vocab_size);
    ASSERT_TRUE(tok.ok()) << tok.status();
    EXPECT_FALSE(tok->Encode("hello world", true, false).empty());
  }
}

// With llama.cpp at hand ($LLAMA_CPP_BIN, the folder of llama-quantize): its quantization of
// our F32 file is our quantized file, tensor for tensor, byte for byte (llama-quantize adds no
// key we lack). Skipped without it.
TEST(MakeGgufModelTest, LlamaQuantizeMakesTheSameTensors) {
  const char* bin = std::getenv("LLAMA_CPP_BIN");
  const std::string quantize = bin == nullptr ? "" : std::string(bin) + "/llama-quantize";
  if (quantize.empty() || !std::filesystem::exists(quantize)) {
    GTEST_SKIP() << "set LLAMA_CPP_BIN to the folder of llama.cpp's llama-quantize";
  }
  TempDir dir;
  for (Architecture arch : {Architecture::kLlama, Architecture::kQwen2}) {
    for (const char* type : {"q4_k_m", "q5_k_m", "q6_k", "q8_0"}) {
      SCOPED_TRACE(absl::StrCat(ArchitectureName(arch), " ", type));
      RandomGgufOptions o;
      o.config = SmallConfig(arch);
      o.config.hidden_dim = 512;  // rows of 256: no Q5_K -> Q5_1 fallback, which heavykv lacks
      o.config.shared_classifier = arch == Architecture::kQwen2;
      o.weights = *ParseGgufWeightMix("f32");
      ASSERT_TRUE(WriteRandomGgufModel(o, dir.File("f32.gguf")).ok());
      o.weights = *ParseGgufWeightMix(type);
      ASSERT_TRUE(WriteRandomGgufModel(o, dir.File("ours.gguf")).ok());
      int code = 0;
      RunCapture(absl::StrCat(quantize, " ", dir.File("f32.gguf"), " ", dir.File("theirs.gguf"),
                              " ", type, " 1 2>&1"),
                 &code);
      ASSERT_EQ(code, 0);
      absl::StatusOr<GgufFile> ours = GgufFile::Open(dir.File("ours.gguf"));
      absl::StatusOr<GgufFile> theirs = GgufFile::Open(dir.File("theirs.gguf"));
      ASSERT_TRUE(ours.ok() && theirs.ok());
      ASSERT_EQ(ours->tensors().size(), theirs->tensors().size());
      for (const GgufTensor& t : theirs->tensors()) {
        const GgufTensor* mine = ours->FindTensor(t.name);
        ASSERT_NE(mine, nullptr) << t.name;
        EXPECT_EQ(mine->type, t.type) << t.name;
        EXPECT_TRUE(std::equal(mine->data.begin(), mine->data.end(), t.data.begin(), t.data.end()))
            << t.name;
      }
      for (const GgufMetadata& m : theirs->metadata()) {
        EXPECT_NE(ours->FindMetadata(m.key), nullptr) << m.key;
      }
    }
  }
}

// The command: a GGUF file from flags, and one-line errors with a non-zero exit.
TEST(MakeGgufModelTest, CommandWritesAndRefuses) {
  TempDir dir;
  const std::string bin = HEAVYKV_BINARY;
  int code = 0;
  const std::string out = dir.File("s.gguf");
  RunCapture(absl::StrCat(bin, " make-model --format gguf --shape stories260K --arch qwen3 ",
                          "--weight-type q4_k_m --out ", out, " 2>&1"),
             &code);
  ASSERT_EQ(code, 0);
  absl::StatusOr<GgufFile> f = GgufFile::Open(out);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*f->GetString("general.architecture"), "qwen3");
  EXPECT_EQ(*f->GetString("general.name"), "random-stories260K");
  EXPECT_EQ(f->FindTensor("output.weight"), nullptr);  // stories260K ties

  for (const auto& [flags, message] : {
           std::pair<std::string, std::string>{"--format gguf --shape stories260K --arch gpt2",
                                               "unknown architecture"},
           {"--format gguf --shape stories260K --weight-type q3_k", "unknown weight type"},
           {"--format onnx --shape stories260K", "unknown --format"},
           {"--shape qwen2.5-0.5b", "llama2.c checkpoint holds only the llama"},
           {"--shape stories260K --weight-type q4_0", "applies to --format gguf only"},
       }) {
    const std::string text = RunCapture(
        absl::StrCat(bin, " make-model ", flags, " --out ", dir.File("x.bin"), " 2>&1"), &code);
    EXPECT_TRUE(WIFEXITED(code) && WEXITSTATUS(code) != 0) << flags;
    EXPECT_TRUE(absl::StrContains(text, message)) << flags << ": " << text;
  }
}

}  // namespace
}  // namespace heavykv
