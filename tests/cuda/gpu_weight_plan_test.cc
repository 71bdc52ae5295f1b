// GpuWeightPlan (engine/cuda/gpu_weight_plan.h) and the --gpu-weights option, host side: runs
// without a GPU. The plan is what the CUDA runner uploads and what DefaultKvPages subtracts, so
// these tests pin the layout (offsets aligned, parts covering the rows, quantized parts byte for
// byte the file's blocks), the bytes per format, the issue-32 memory target (Q4_K_M weights
// <= 1.1x the file's tensor bytes), and the refusals (q5_0 rows, a CPU device).
#include "engine/cuda/gpu_weight_plan.h"

#include <gtest/gtest.h>

#include <set>
#include <variant>

#include "engine/cuda/cuda_model_runner.h"
#include "engine/gguf/gguf.h"
#include "engine/runner/step_runner.h"
#include "kernels/cuda/quant_blocks.cuh"
#include "tests/test_util.h"

namespace heavykv {
namespace {

using cpu::QuantType;

Model Load(const std::string& rel) {
  absl::StatusOr<Model> m = LoadModel(testing::SourcePath(rel));
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : Model{};
}

int64_t FormatBytes(const GpuWeightPlan& p, const std::string& name) {
  for (const auto& [n, b] : p.bytes_by_format) {
    if (n == name) return b;
  }
  return 0;
}

// Every matrix plan of `p`, with its Linear.
std::vector<std::pair<const GpuMatrixPlan*, const cpu::Linear*>> Matrices(const GpuWeightPlan& p,
                                                                          const Model& m) {
  std::vector<std::pair<const GpuMatrixPlan*, const cpu::Linear*>> out;
  for (size_t l = 0; l < m.layers.size(); ++l) {
    out.push_back({&p.layers[l].wqkv, &m.layers[l].wqkv});
    out.push_back({&p.layers[l].wo, &m.layers[l].wo});
    out.push_back({&p.layers[l].w13, &m.layers[l].w13});
    out.push_back({&p.layers[l].w2, &m.layers[l].w2});
  }
  out.push_back({&p.classifier, &m.classifier});
  return out;
}

// The invariants of any plan: parts in row order covering the matrix, each at an aligned offset,
// no two overlapping, all inside total_bytes; the per-format sums equal the parts' bytes.
void CheckLayout(const GpuWeightPlan& p, const Model& m) {
  std::vector<std::pair<int64_t, int64_t>> spans;
  int64_t matrix_bytes = 0;
  for (auto [mp, linear] : Matrices(p, m)) {
    EXPECT_EQ(mp->rows, linear->rows());
    EXPECT_EQ(mp->cols, linear->cols());
    int64_t row = 0;
    for (const GpuPart& part : mp->parts) {
      EXPECT_EQ(part.linear, linear);
      EXPECT_EQ(part.row0, row);
      EXPECT_EQ(part.offset % kGpuWeightAlign, 0);
      EXPECT_EQ(part.bytes, part.rows * part.row_bytes);
      if (!part.quantized()) {
        EXPECT_EQ(part.row_bytes, part.cols * 2);
      }
      spans.push_back({part.offset, part.offset + part.bytes});
      matrix_bytes += part.bytes;
      row += part.rows;
    }
    EXPECT_EQ(row, linear->rows());
  }
  if (!p.embedding_is_classifier) {
    for (const GpuPart& part : p.embedding.parts)
      spans.push_back({part.offset, part.offset + part.bytes});
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].second, spans[i].first);
  ASSERT_FALSE(spans.empty());
  EXPECT_LE(spans.back().second, p.total_bytes);
  EXPECT_EQ(p.step_bytes, matrix_bytes);
  int64_t by_format = 0;
  for (const auto& [name, b] : p.bytes_by_format) by_format += b;
  const int64_t emb = p.embedding_is_classifier ? 0 : p.embedding.bytes();
  EXPECT_EQ(by_format - FormatBytes(p, "f32"), matrix_bytes + emb);
}

TEST(GpuWeightPlanTest, Bf16IsOneBf16PartPerMatrixAsBefore) {
  const Model m = Load("models/stories260K.bin");
  absl::StatusOr<GpuWeightPlan> p = PlanGpuWeights(m, GpuWeights::kBf16);
  ASSERT_TRUE(p.ok()) << p.status();
  CheckLayout(*p, m);
  int64_t params = 0;
  for (auto [mp, linear] : Matrices(*p, m)) {
    ASSERT_EQ(mp->parts.size(), 1u);
    EXPECT_FALSE(mp->parts[0].quantized());
    EXPECT_EQ(mp->parts[0].part_index, -1);  // the whole matrix, row-major
    params += linear->rows() * linear->cols();
  }
  // What the runner reported before the plan existed: every matrix in bf16.
  EXPECT_EQ(p->step_bytes, params * 2);
  EXPECT_TRUE(p->embedding_is_classifier);  // stories260K shares its classifier
  ASSERT_EQ(p->bytes_by_format.size(), 2u);
  EXPECT_EQ(p->bytes_by_format[0].first, "bf16");
  EXPECT_EQ(p->bytes_by_format[1].first, "f32");
  EXPECT_EQ(*CudaWeightBytes(m), p->total_bytes);
}

TEST(GpuWeightPlanTest, QuantizedKeepsTheFileBlocksByteForByte) {
  const Model m = Load("tests/data/gguf/rl256-q4_k_m.gguf");
  absl::StatusOr<GpuWeightPlan> p = PlanGpuWeights(m, GpuWeights::kQuantized);
  ASSERT_TRUE(p.ok()) << p.status();
  CheckLayout(*p, m);
  std::set<std::string> formats;
  bool mixed = false;
  for (auto [mp, linear] : Matrices(*p, m)) {
    ASSERT_EQ(mp->parts.size(), linear->parts().size());
    mixed = mixed || mp->parts.size() > 1;
    for (const GpuPart& part : mp->parts) {
      const auto& q = std::get<cpu::QuantMatrix>(linear->parts()[part.part_index]);
      ASSERT_TRUE(part.quantized());
      EXPECT_EQ(part.format, q.type());
      EXPECT_EQ(part.row_bytes, q.row_bytes());
      EXPECT_EQ(part.bytes, q.bytes());
      EXPECT_EQ(part.rows, q.rows());
      // The kernels' view agrees with the CPU's block geometry.
      const auto t = static_cast<cuda::QuantBlockType>(part.format);
      EXPECT_EQ(cuda::QuantBlockElemsOf(t), cpu::QuantBlockElems(q.type()));
      EXPECT_EQ(cuda::QuantBlockBytesOf(t), cpu::QuantBlockBytes(q.type()));
      formats.insert(cpu::QuantTypeName(part.format));
    }
  }
  EXPECT_TRUE(mixed) << "Q4_K_M stores some attn_v as Q6_K: a fused wqkv of two parts";
  EXPECT_EQ(formats, (std::set<std::string>{"q4_K", "q6_K"}));
  // The separate token_embd (Q4_K) stays quantized: one part, gathered by QuantEmbedding.
  ASSERT_FALSE(p->embedding_is_classifier);
  ASSERT_EQ(p->embedding.parts.size(), 1u);
  EXPECT_EQ(p->embedding.parts[0].format, QuantType::kQ4_K);
  EXPECT_EQ(FormatBytes(*p, "bf16"), 0);
  EXPECT_GT(FormatBytes(*p, "q4_K"), 0);
  EXPECT_GT(FormatBytes(*p, "q6_K"), 0);

  // Issue 32's memory target: <= 1.1x the file's tensor bytes (here exactly them, plus padding
  // to 256-byte boundaries), against ~3.6x for the bf16 upload.
  absl::StatusOr<GgufFile> f =
      GgufFile::Open(testing::SourcePath("tests/data/gguf/rl256-q4_k_m.gguf"));
  ASSERT_TRUE(f.ok()) << f.status();
  int64_t file_bytes = 0;
  for (const GgufTensor& t : f->tensors()) file_bytes += int64_t(t.data.size());
  EXPECT_LE(double(p->total_bytes), 1.1 * double(file_bytes));
  absl::StatusOr<GpuWeightPlan> bf16 = PlanGpuWeights(m, GpuWeights::kBf16);
  ASSERT_TRUE(bf16.ok());
  EXPECT_GT(double(bf16->total_bytes), 3.0 * double(p->total_bytes));
  EXPECT_EQ(*CudaWeightBytes(m, {.gpu_weights = GpuWeights::kQuantized}), p->total_bytes);
}

TEST(GpuWeightPlanTest, EveryKernelFormatIsKept) {
  for (const char* name :
       {"rl256-q4_0", "rl256-q8_0", "rl256-q5_k_m", "rl256-q6_k", "rq256-q4_k_m", "rq256-q8_0"}) {
    SCOPED_TRACE(name);
    const Model m = Load(std::string("tests/data/gguf/") + name + ".gguf");
    absl::StatusOr<GpuWeightPlan> p = PlanGpuWeights(m, GpuWeights::kQuantized);
    ASSERT_TRUE(p.ok()) << p.status();
    CheckLayout(*p, m);
    EXPECT_EQ(FormatBytes(*p, "bf16"), 0);
  }
}

TEST(GpuWeightPlanTest, FloatMatricesGoBf16UnderQuantized) {
  // An fp32 checkpoint has nothing to keep quantized: the same bf16 matrices, one part each.
  const Model m = Load("models/stories260K.bin");
  absl::StatusOr<GpuWeightPlan> q = PlanGpuWeights(m, GpuWeights::kQuantized);
  absl::StatusOr<GpuWeightPlan> b = PlanGpuWeights(m, GpuWeights::kBf16);
  ASSERT_TRUE(q.ok() && b.ok());
  CheckLayout(*q, m);
  for (auto [mp, linear] : Matrices(*q, m)) {
    ASSERT_EQ(mp->parts.size(), 1u);
    EXPECT_EQ(mp->parts[0].part_index, -1);
  }
  EXPECT_EQ(q->step_bytes, b->step_bytes);
  EXPECT_EQ(q->bytes_by_format, b->bytes_by_format);
}

TEST(GpuWeightPlanTest, BlockFormatsWithoutAKernelAreRefused) {
  // s260-q4_k_m.gguf: dim 64 is not a multiple of 256, so llama-quantize fell back to Q5_0 (and
  // F16 for ffn_down); the GPU has no Q5_0 kernel.
  const Model m = Load("tests/data/gguf/s260-q4_k_m.gguf");
  absl::StatusOr<GpuWeightPlan> p = PlanGpuWeights(m, GpuWeights::kQuantized);
  ASSERT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("layer 0 wqkv"), std::string::npos) << p.status();
  EXPECT_NE(p.status().message().find("q5_0"), std::string::npos) << p.status();
  EXPECT_NE(p.status().message().find("--gpu-weights bf16"), std::string::npos) << p.status();
  EXPECT_EQ(CudaWeightBytes(m, {.gpu_weights = GpuWeights::kQuantized}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // The bf16 path still takes it.
  EXPECT_TRUE(PlanGpuWeights(m, GpuWeights::kBf16).ok());
  EXPECT_FALSE(HasGpuQuantKernel(QuantType::kQ5_0));
  for (QuantType t :
       {QuantType::kQ4_0, QuantType::kQ8_0, QuantType::kQ4_K, QuantType::kQ5_K, QuantType::kQ6_K}) {
    EXPECT_TRUE(HasGpuQuantKernel(t)) << cpu::QuantTypeName(t);
  }
}

TEST(GpuWeightPlanTest, APartAtAnUnalignedRowIsRefused) {
  // A fused matrix whose second part starts at row 6: its outputs would not be 16-byte aligned.
  const int64_t k = 256;
  std::vector<float> w(10 * k, 0.25f);
  Model m;
  m.config.dim = int32_t(k);
  m.config.num_layers = 0;
  cpu::Linear l(*cpu::QuantMatrix::Quantize(QuantType::kQ4_K, w.data(), 6, k));
  ASSERT_TRUE(l.Append(*cpu::QuantMatrix::Quantize(QuantType::kQ6_K, w.data(), 4, k)).ok());
  m.classifier = std::move(l);
  absl::StatusOr<GpuWeightPlan> p = PlanGpuWeights(m, GpuWeights::kQuantized);
  ASSERT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("row 6"), std::string::npos) << p.status();
  EXPECT_TRUE(PlanGpuWeights(m, GpuWeights::kBf16).ok());
}

TEST(GpuWeightsOptionTest, ParsesAndIsRefusedOffCuda) {
  EXPECT_EQ(*ParseGpuWeights("bf16"), GpuWeights::kBf16);
  EXPECT_EQ(*ParseGpuWeights("quantized"), GpuWeights::kQuantized);
  absl::StatusOr<GpuWeights> bad = ParseGpuWeights("q4_k");
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("bf16 or quantized"), std::string::npos);
  EXPECT_EQ(GpuWeightsName(GpuWeights::kQuantized), "quantized");
  EXPECT_TRUE(CheckGpuWeights(Device::kCuda, GpuWeights::kQuantized).ok());
  EXPECT_TRUE(CheckGpuWeights(Device::kCpu, GpuWeights::kBf16).ok());
  EXPECT_EQ(CheckGpuWeights(Device::kCpu, GpuWeights::kQuantized).code(),
            absl::StatusCode::kInvalidArgument);
  // MakeStepRunner refuses it on the CPU before building anything.
  const Model m = Load("models/stories260K.bin");
  auto cache = *CreateKvCache(Device::kCpu, KvShapeForDevice(Device::kCpu, m.config, 16), 8);
  EXPECT_EQ(MakeStepRunner(Device::kCpu, m, cache.get(), {.gpu_weights = GpuWeights::kQuantized})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MakeStepRunner(Device::kCpu, m, cache.get()).ok());
  EXPECT_EQ(FormatBytesByFormat({{"q4_K", 3 << 20}, {"f32", 1 << 19}}),
            "q4_K 3.0 MiB, f32 0.5 MiB");
}

}  // namespace
}  // namespace heavykv
