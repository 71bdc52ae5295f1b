// StepRunner: the backend interface of the forward pass. A runner executes one batched step of
// the model over many sequences whose KV caches live in one KvCache, and returns the logits; the
// CPU ModelRunner (engine/runner/model_runner.h) and the CUDA runner
// (engine/cuda/cuda_model_runner.h) implement it, and Engine, Evaluate and Generate use either
// through this interface.
//
//   absl::StatusOr<Device> device = ParseDevice("cuda");
//   KvShape shape = KvShapeForDevice(*device, model.config, 16);
//   auto cache = CreateKvCache(*device, shape, *DefaultKvPages(*device, model, shape));
//   auto runner = MakeStepRunner(*device, model, cache->get());
//   (*runner)->Forward(steps);
//
// Contract of Forward (both backends): validate the plan, reserve the new tokens' pages
// all-or-nothing, run every layer (append K/V, attend, per-head eviction right after each layer's
// attention), Commit every sequence, return logits. An invalid plan changes nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/model/model.h"
#include "memory/kv_cache.h"

namespace heavykv {

// One sequence's part of a step.
struct SequenceStep {
  SequenceKv* kv = nullptr;          // the sequence's cache, changed through the KvCache
  std::span<const int32_t> tokens;   // fed at positions [start_pos, start_pos + tokens.size())
  int32_t start_pos = 0;
  bool all_logits = false;           // logits for every token (scoring) or only for the last
};

class StepRunner {
 public:
  virtual ~StepRunner() = default;

  // Runs one step. Returns the logits [rows][vocab] in host memory: for each step in order, one
  // row per token if all_logits else one row for its last token. The span is valid until the
  // next Forward(). RESOURCE_EXHAUSTED if the pool cannot hold the new tokens (the step did not
  // run and holds no new page). INVALID_ARGUMENT for a token id outside the vocabulary or a
  // position past the model's context. A device backend may also return INTERNAL (a device
  // error), after which the runner is unusable.
  virtual absl::StatusOr<std::span<const float>> Forward(std::span<const SequenceStep> steps) = 0;

  virtual const Model& model() const = 0;
  virtual KvCache& cache() = 0;
  // OK when this backend can run `policy` (null: the full cache) with a sequence's own row type
  // `quant` (SequenceKv::quant; kNone: the pool's); UNIMPLEMENTED naming the policy or the type
  // (INVALID_ARGUMENT for a type that saves nothing here) otherwise, so that callers refuse a
  // request before it joins a batch. Thread-safe.
  virtual absl::Status SupportsPolicy(const EvictionPolicy* policy,
                                      KvQuant quant = KvQuant::kNone) const {
    return absl::OkStatus();
  }
  // Bytes of weights this runner holds in device memory, per format ("q4_K", "bf16", "f32"...),
  // in the order first met; empty for a backend that reads the Model's own (the CPU).
  virtual std::vector<std::pair<std::string, int64_t>> DeviceWeightBytes() const { return {}; }
};

// Checks a step plan against the model: tokens present, ids in the vocabulary, positions within
// the context (past it only where `past_context` and StreamsPastContext allow: the CPU runner).
// Sets the step's token count and logits rows. (Inline: the CUDA runner's library uses it without
// linking heavykv_engine.)
inline absl::Status ValidateSteps(const ModelConfig& c, std::span<const SequenceStep> steps,
                                  int64_t* num_tokens, int64_t* num_rows,
                                  bool past_context = false) {
  int64_t T = 0, rows = 0;
  for (const SequenceStep& st : steps) {
    if (st.kv == nullptr) return absl::InvalidArgumentError("a sequence step has no cache");
    if (st.tokens.empty()) return absl::InvalidArgumentError("a sequence step has no tokens");
    const int64_t end = st.start_pos + int64_t(st.tokens.size());
    if (st.start_pos < 0 ||
        (end > c.seq_len &&
         !(past_context && StreamsPastContext(*st.kv, st.tokens.size(), c.seq_len)))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "positions ", st.start_pos, "..", end - 1, " exceed the model's context length ",
          c.seq_len, past_context ? " (only window and sink, with a budget of at most the context "
                                    "minus the step's tokens, run past it)"
                                  : ""));
    }
    for (int32_t tok : st.tokens) {
      if (tok < 0 || tok >= c.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", tok, " is outside the vocabulary [0, ", c.vocab_size, ")"));
      }
    }
    T += st.tokens.size();
    rows += st.all_logits ? st.tokens.size() : 1;
  }
  *num_tokens = T;
  *num_rows = rows;
  return absl::OkStatus();
}

enum class Device { kCpu, kCuda };

// "cpu" or "cuda"; INVALID_ARGUMENT otherwise.
absl::StatusOr<Device> ParseDevice(absl::string_view name);
absl::string_view DeviceName(Device device);
// Whether this binary has the CUDA backend (HEAVYKV_CUDA).
bool BuiltWithCuda();
// OK when `device` can run here: FAILED_PRECONDITION "built without CUDA" or "no CUDA device".
absl::Status CheckDevice(Device device);

// The element type of the cached K/V (--kv-dtype): auto is fp32 on the CPU (what the greedy
// and eval tests pin against llama2.c) and bf16 on CUDA; bf16 on the CPU halves the pool's bytes
// per token (twice the tokens in the same --kv-pool-mb) and the K/V a decode step reads, at
// bf16 rounding of K and V (attention itself still runs in fp32). int8 and int4 (CPU only)
// quantize each row of each kv head on write (kernels/kv_quant.h: int8 with a power-of-two scale
// per row, int4 with an fp16 scale per 32 elements), ~1.9x and ~3.3x bf16's tokens per MiB.
enum class KvDtype { kAuto, kFp32, kBf16, kInt8, kInt4 };
// The valid names, for messages: "auto, fp32, bf16, int8 or int4".
inline constexpr const char* kKvDtypeNames = "auto, fp32, bf16, int8 or int4";
// One of kKvDtypeNames; INVALID_ARGUMENT listing them otherwise.
absl::StatusOr<KvDtype> ParseKvDtype(absl::string_view name);
// INVALID_ARGUMENT when `device` cannot hold that type (the CUDA backend stores bf16 only:
// fp32 is INVALID_ARGUMENT, int8 and int4 UNIMPLEMENTED).
absl::Status CheckKvDtype(Device device, KvDtype dtype);
// ParseKvDtype, then CheckKvDtype for `device`.
absl::StatusOr<KvDtype> ResolveKvDtype(Device device, absl::string_view name);
// The name of the type actually used on `device` ("fp32", "bf16", "int8" or "int4").
absl::string_view KvDtypeName(Device device, KvDtype dtype);

// How the CUDA backend holds the weight matrices (--gpu-weights): kBf16 (the default) uploads
// every matrix as bf16, quantized GGUF parts dequantized; kQuantized keeps Q4_0, Q8_0, Q4_K,
// Q5_K and Q6_K parts as the file's blocks and multiplies them with kernels/cuda/quant_gemv.cuh
// (docs/ARCHITECTURE.md, "Quantized weights on the GPU"). kQuantized is COMPILED BUT HAS NEVER
// RUN ON A GPU (issue 32): it stays opt-in until scripts/gpu-check.sh has passed with it.
enum class GpuWeights { kBf16, kQuantized };
inline constexpr const char* kGpuWeightsNames = "bf16 or quantized";
// "bf16" or "quantized"; INVALID_ARGUMENT naming them otherwise.
absl::StatusOr<GpuWeights> ParseGpuWeights(absl::string_view name);
absl::string_view GpuWeightsName(GpuWeights weights);
// INVALID_ARGUMENT for kQuantized on the CPU (whose quantized matrices are always kept as the
// file's blocks: the flag is for --device cuda).
absl::Status CheckGpuWeights(Device device, GpuWeights weights);

// "q4_K 612.3 MiB, q6_K 98.1 MiB, f32 0.3 MiB": StepRunner::DeviceWeightBytes for logs.
std::string FormatBytesByFormat(const std::vector<std::pair<std::string, int64_t>>& by_format);

// What a caller may choose about a runner beyond the model and the cache.
struct StepRunnerOptions {
  GpuWeights gpu_weights = GpuWeights::kBf16;  // CUDA only (CheckGpuWeights)
};

// The KV shape of `config` on `device` with K/V elements of `dtype`.
KvShape KvShapeForDevice(Device device, const ModelConfig& config, int32_t block_size,
                         KvDtype dtype = KvDtype::kAuto);
// Pool size when no flag gives one. CUDA: free GPU memory minus the bf16 weights minus a reserve
// of max(1 GiB, 10% of the GPU's memory) for activations, scratch and cuBLAS, in pages.
// CPU: UNIMPLEMENTED (the CPU callers size the pool from their workload).
// The weights' bytes follow options.gpu_weights.
absl::StatusOr<int32_t> DefaultKvPages(Device device, const Model& model, const KvShape& shape,
                                       const StepRunnerOptions& options = {});
// The cache a runner on `device` needs: host storage on the CPU, external (device) storage on
// CUDA.
absl::StatusOr<std::unique_ptr<KvCache>> CreateKvCache(Device device, const KvShape& shape,
                                                       int32_t num_pages);
// The runner of `device` over `model` and `cache` (both must outlive it; the cache must come
// from CreateKvCache for the same device).
// INVALID_ARGUMENT for options the device cannot take (CheckGpuWeights), or (CUDA, kQuantized)
// a matrix in a block format without a CUDA kernel, naming it.
absl::StatusOr<std::unique_ptr<StepRunner>> MakeStepRunner(Device device, const Model& model,
                                                           KvCache* cache,
                                                           const StepRunnerOptions& options = {});

}  // namespace heavykv
