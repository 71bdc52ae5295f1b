// CudaModelRunner: the CUDA backend of StepRunner (engine/runner/step_runner.h). Plain C++ header
// (the CUDA types stay in the .cc), built only with HEAVYKV_CUDA.
//
// Memory ownership:
//  - The KvCache (created with KvStorage::kExternal) owns the page ids, block tables and slot
//    counts, on the host, exactly as on the CPU: Reserve before a step, Commit after it.
//  - This runner owns everything in GPU memory: the bf16 weights (uploaded once from the Model:
//    each matrix read back row-major with Linear::ToRowMajor, quantized GGUF parts dequantized,
//    then rounded to bf16; norms, q/k/v biases, q/k norm weights and the rope table in fp32),
//    the K/V pool ([pages][layers][kv_heads][2][block_size][head_dim] bf16, the CPU's
//    layout), the per-slot pos (int32) and score (fp32) arrays, activations and scratch.
//  - Per step the host uploads one int32 buffer (block tables as indptr + page ids, counts,
//    rules, tokens; engine/cuda/step_layout.h) and downloads the logits. Appending K/V,
//    attention with H2O score accumulation, and eviction (victim choice and compaction, one
//    kernel per layer after its attention) all run on the GPU, with no host round trip in the
//    step; the host only calls KvCache::Commit.
// Runs every model the CPU runner does (engine/runner/model_runner.cc): the llama, qwen2 (q/k/v
// bias, NEOX rope) and qwen3 (per-head q/k RMSNorm, q_dim != dim) blocks, with the model's rope
// theta, rope_freqs factors and RMS epsilon.
// Numerics: bf16 weights, K/V and GEMM inputs; fp32 accumulation, residual stream, norms, biases,
// RoPE, softmax and scores. Not thread-safe: one thread drives a runner (as with ModelRunner).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/runner/step_runner.h"

namespace heavykv {

class CudaModelRunner final : public StepRunner {
 public:
  // FAILED_PRECONDITION without a device; RESOURCE_EXHAUSTED when the weights or the pool do
  // not fit; INVALID_ARGUMENT for a shape the kernels do not take (head_dim a multiple of 8 up
  // to 256, at most 8 query heads per kv head) or a cache not created for CUDA.
  static absl::StatusOr<std::unique_ptr<CudaModelRunner>> Create(const Model& model,
                                                                 KvCache* cache);
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
  // Bytes of bf16 weights a decode step reads (every matrix once, the classifier once).
  int64_t WeightBytes() const;
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
// Bytes of bf16 weights of `model` on the GPU.
int64_t CudaWeightBytes(const Model& model);
// The default pool: (free GPU memory - weights - max(1 GiB, 10% of total)) / page bytes.
absl::StatusOr<int32_t> CudaDefaultKvPages(const Model& model, const KvShape& shape);
absl::StatusOr<std::unique_ptr<StepRunner>> MakeCudaModelRunner(const Model& model,
                                                                KvCache* cache);

}  // namespace heavykv
