// CudaModelRunner: the CUDA backend of StepRunner (engine/runner/step_runner.h). Plain C++ header
// (the CUDA types stay in the .cc), built only with HEAVYKV_CUDA.
//
// Memory ownership:
//  - The KvCache (created with KvStorage::kExternal) owns the page ids, block tables and slot
//    counts, on the host, exactly as on the CPU: Reserve before a step, Commit after it.
//  - This runner owns everything in GPU memory: the weights (uploaded once from the Model, laid
//    out by GpuWeightPlan: by default each matrix read back row-major with Linear::ToRowMajor,
//    quantized GGUF parts dequantized, then rounded to bf16; with --gpu-weights quantized the
//    Q4_0/Q8_0/Q4_K/Q5_K/Q6_K parts keep the file's blocks; norms, q/k/v biases, q/k norm
//    weights and the rope table in fp32), the K/V pool ([pages][layers][kv_heads][2][block_size][head_dim] bf16, the CPU's
//    layout), the per-slot pos (int32) and score (fp32) arrays, activations and scratch.
//  - Per step the host uploads one int32 buffer (block tables as indptr + page ids, counts,
//    rules, tokens; engine/cuda/step_layout.h) and downloads the logits. Appending K/V,
//    attention with H2O score accumulation, and eviction (victim choice and compaction, one
//    kernel per layer after its attention) all run on the GPU, with no host round trip in the
//    step; the host only calls KvCache::Commit.
// Runs every model the CPU runner does (engine/runner/model_runner.cc): the llama, qwen2 (q/k/v
// bias, NEOX rope) and qwen3 (per-head q/k RMSNorm, q_dim != dim) blocks, with the model's rope
// theta, rope_freqs factors and RMS epsilon.
// Numerics: bf16 weights (or the file's blocks, decoded exactly in fp32), K/V and GEMM inputs;
// fp32 accumulation, residual stream, norms, biases, RoPE, softmax and scores. Not thread-safe: one thread drives a runner (as with ModelRunner).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/runner/step_runner.h"

namespace heavykv {

class CudaModelRunner final : public StepRunner {
 public:
  // FAILED_PRECONDITION without a device; RESOURCE_EXHAUSTED when the weights or the pool do
  // not fit; INVALID_ARGUMENT for a shape the kernels do not take (head_dim a multiple of 8 up
  // to 256, at most 8 query heads per kv head) or a cache not created for CUDA.
  // options.gpu_weights kQuantized (COMPILED, NEVER RUN ON A GPU; issue 32) keeps the Q4_0,
  // Q8_0, Q4_K, Q5_K and Q6_K parts as the file's blocks (GpuWeightPlan, gpu_weight_plan.h) and
  // refuses other block formats with INVALID_ARGUMENT before touching the device.
  static absl::StatusOr<std::unique_ptr<CudaModelRunner>> Create(
      const Model& model, KvCache* cache, const StepRunnerOptions& options = {});
  ~CudaModelRunner() override;

  absl::StatusOr<std::span<const float>> Forward(std::span<const SequenceStep> steps) override;
  const Model& model() const override;
  KvCache& cache() override;
  // The policies with a GPU rule (EvictionPolicy::GpuRule): full, window, sink, h2o.
  absl::Status SupportsPolicy(const EvictionPolicy* policy,
                              KvQuant quant = KvQuant::kNone) const override;

  // Benchmarks: the step of Forward without copying the logits back or waiting for the GPU
  // (Synchronize() waits). Same validation, reservation and Commit.
  absl::Status ForwardOnDevice(std::span<const SequenceStep> steps);
  absl::Status Synchronize();
  // Benchmarks and tests: Reserve(num_slots) for an empty `seq`, fill slots [0, num_slots) of
  // every (layer, kv head) with pseudo-random K/V, positions 0.. and scores in [0, 1), Commit.
  absl::Status FillSyntheticKv(SequenceKv& seq, int32_t num_slots, uint64_t seed);
  // Tests: positions and scores of slots [0, seq.num_slots) of (layer, kv_head).
  absl::Status ReadSlots(const SequenceKv& seq, int32_t layer, int32_t kv_head,
                         std::vector<int32_t>* pos, std::vector<float>* score);
  // Bytes of weights a decode step reads on the device (every matrix once, the classifier once),
  // in the formats they are held in (bf16, or the file's blocks under kQuantized).
  int64_t WeightBytes() const;
  // The weight allocation's bytes per format ("q4_K", "q6_K", "bf16", "f32").
  std::vector<std::pair<std::string, int64_t>> DeviceWeightBytes() const override;
  // Bytes of GPU memory this runner holds (weights, pool, activations, scratch).
  int64_t DeviceBytes() const;

 private:
  struct Impl;
  explicit CudaModelRunner(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// OK when a CUDA device is usable; FAILED_PRECONDITION "no CUDA device" (with the runtime's
// reason) otherwise.
absl::Status CheckCudaDevice();
// Tells tests whether to skip: true when CheckCudaDevice() is OK.
bool HasCudaDevice();
// Bytes of the weight allocation of `model` on the GPU under `options` (GpuWeightPlan's
// total_bytes); the plan's INVALID_ARGUMENT when it refuses the model.
absl::StatusOr<int64_t> CudaWeightBytes(const Model& model, const StepRunnerOptions& options = {});
// The default pool: (free GPU memory - weights - max(1 GiB, 10% of total)) / page bytes.
absl::StatusOr<int32_t> CudaDefaultKvPages(const Model& model, const KvShape& shape,
                                           const StepRunnerOptions& options = {});
absl::StatusOr<std::unique_ptr<StepRunner>> MakeCudaModelRunner(
    const Model& model, KvCache* cache, const StepRunnerOptions& options = {});

}  // namespace heavykv
