// GpuWeightPlan: where each weight of a Model goes in the CUDA runner's one weight allocation, in
// which format, and how many bytes each format takes (issue 32). Plain C++ (no CUDA types), so the
// layout, the refusals and the byte counts are tested without a device
// (tests/cuda/gpu_weight_plan_test.cc).
//
//   absl::StatusOr<GpuWeightPlan> plan = PlanGpuWeights(model, GpuWeights::kQuantized);
//   plan->total_bytes;           // the allocation (what DefaultKvPages subtracts)
//   plan->bytes_by_format;       // {"q4_K", ...}, {"q6_K", ...}, {"f32", norms}
//
// A matrix (a cpu::Linear) becomes one or more GpuParts, each a block of its rows:
//  - GpuWeights::kBf16: one part, the whole matrix as row-major bf16 (Linear::ToRowMajor).
//  - GpuWeights::kQuantized: a matrix without a block-format part is planned as under kBf16;
//    otherwise one part per Linear part. A QuantMatrix of Q4_0, Q8_0, Q4_K, Q5_K or Q6_K keeps its
//    bytes unchanged (QuantMatrix::bytes(): rows of QuantRowBytes); a float part (PackedMatrix
//    fp32/bf16, or an F16/F32/BF16 QuantMatrix) becomes row-major bf16; any other block format
//    (Q5_0) is refused. A part below the first must start at a row that is a multiple
//    of 4 (its output columns are a 16-byte aligned GEMM output).
// Every part, vector and matrix starts at a multiple of kGpuWeightAlign bytes.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model.h"
#include "engine/runner/step_runner.h"

namespace heavykv {

inline constexpr int64_t kGpuWeightAlign = 256;

struct GpuPart {
  const cpu::Linear* linear = nullptr;   // the matrix the part belongs to
  int part_index = -1;                   // its Linear part; -1: the whole matrix (bf16)
  int64_t row0 = 0, rows = 0, cols = 0;  // rows [row0, row0 + rows) of the matrix
  // cpu::QuantType::kBF16: uploaded as row-major bf16; else the block format kept byte for byte.
  cpu::QuantType format = cpu::QuantType::kBF16;
  int64_t row_bytes = 0;  // bytes of one row on the device
  int64_t offset = 0;     // bytes into the allocation (a multiple of kGpuWeightAlign)
  int64_t bytes = 0;      // rows * row_bytes

  bool quantized() const { return format != cpu::QuantType::kBF16; }
};

struct GpuMatrixPlan {
  std::vector<GpuPart> parts;  // in row order, covering [0, rows)
  int64_t rows = 0, cols = 0;
  int64_t bytes() const;  // the parts' bytes
};

// An fp32 vector copied as is (norm weights, biases).
struct GpuFloats {
  const float* data = nullptr;
  int64_t count = 0;
  int64_t offset = -1;  // -1: the model has none
};

struct GpuLayerPlan {
  GpuMatrixPlan wqkv, wo, w13, w2;
  GpuFloats rms_att, rms_ffn, bqkv, q_norm, k_norm;
};

struct GpuWeightPlan {
  GpuWeights mode = GpuWeights::kBf16;
  std::vector<GpuLayerPlan> layers;
  GpuMatrixPlan classifier;
  // The token embedding: the classifier's own plan when the classifier is shared and one part,
  // else a plan of its own (a single part: one quantized part, else the whole table in bf16).
  GpuMatrixPlan embedding;
  bool embedding_is_classifier = false;
  GpuFloats rms_final;
  int64_t total_bytes = 0;  // the allocation, alignment included
  int64_t step_bytes = 0;   // what a decode step reads: every layer matrix and the classifier
  // Device bytes per format, in the order first met: the block formats kept ("q4_K"), "bf16"
  // (matrices uploaded as bf16) and "f32" (norms, biases); alignment padding not counted.
  std::vector<std::pair<std::string, int64_t>> bytes_by_format;
};

// The plan of `model` under `mode`. INVALID_ARGUMENT under kQuantized when a matrix holds a block
// format without a CUDA kernel ("layer 3 w13 holds q5_0 rows ...; use --gpu-weights bf16") or a
// part starts at a row that is not a multiple of 4.
absl::StatusOr<GpuWeightPlan> PlanGpuWeights(const Model& model, GpuWeights mode);

// Whether the CUDA kernels take blocks of `type` as they are (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K).
bool HasGpuQuantKernel(cpu::QuantType type);

}  // namespace heavykv
