// ModelRunner: executes one batched forward step of the model over many sequences whose KV
// caches live in the shared KvCache.
//
// The runner never decides admission or scheduling: it is handed a step plan (which tokens of
// which sequences) and returns logits. Within the step every weight matrix is applied with one
// GEMM over all tokens of all sequences; attention and per-head eviction run in parallel over
// (sequence, kv head). After the attention of each layer, every (layer, kv head) over its budget
// evicts down to the budget (the chunk's tokens all attend first), as H2O specifies.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model.h"
#include "engine/runner/shared_prefix.h"
#include "engine/runner/step_runner.h"
#include "memory/kv_cache.h"

namespace heavykv {

// The host KvShape that holds `config`'s K/V: pages of `block_size` slots of one layer, a
// block table per layer (KvShapeForDevice gives the CUDA layout).
KvShape KvShapeFor(const ModelConfig& config, int32_t block_size);

// Split-K decode attention: the parts a decode query's context of `slots` slots is cut into when
// a step has `tasks` (sequence, kv head) pairs for `threads` threads, so that all threads attend:
// 1 when the pairs alone keep the threads busy (tasks >= threads), else ceil(threads / tasks),
// but no part shorter than kMinAttentionPartSlots (1 below twice that).
inline constexpr int32_t kMinAttentionPartSlots = 512;
int32_t AttentionParts(int64_t tasks, int32_t threads, int32_t slots);

// Steps of up to this many tokens may run as one parallel region (ModelRunner's team path).
inline constexpr int64_t kTeamMaxTokens = 4;

// The CPU backend of StepRunner.
//
// Threads. A step runs one of two ways, with the same arithmetic (the logits agree bit for bit):
//  - the team path, for decode steps of at most kTeamMaxTokens tokens when every layer matrix
//    is a block format on the int8 path (cpu::Linear::TeamCapable) and the step has at least as
//    many (sequence, kv head) pairs as threads: the whole step is one OpenMP parallel region.
//    Every thread normalises the residual stream into its own copy (and quantizes it inside
//    MultiplyTeam), the threads take each matrix's rows in chunks as they come
//    (cpu::MatmulQuantTeam) and the (sequence, kv head) pairs one at a time, each pair's bias,
//    q/k norms and rotation with it; six barriers a layer, where data flows between threads
//    (after the qkv, attention, wo, gate/up, SwiGLU and down stages; the attention's is the end
//    of its loop); then the classifier too when it is a block format (a shared embedding
//    usually is: Q8_0, Q6_K).
//  - the general path for everything else (prefill chunks, large decode batches, split-K, fp32 /
//    bf16 / f16 weights): each operation is its own parallel region where it is large enough.
class ModelRunner : public StepRunner {
 public:
  // `model` and `cache` must outlive the runner; the cache's shape must match the model.
  ModelRunner(const Model& model, KvCache* cache);

  // Runs one step. Returns the logits [rows][vocab]: for each step in order, one row per token if
  // all_logits else one row for its last token. The span is valid until the next Forward().
  // RESOURCE_EXHAUSTED if the pool cannot hold the new tokens (the step did not run and holds
  // no new page). INVALID_ARGUMENT for a token id outside the vocabulary or a position past the
  // model's context, except for a sequence that StreamsPastContext (memory/kv_cache.h).
  absl::StatusOr<std::span<const float>> Forward(std::span<const SequenceStep> steps) override;

  const Model& model() const override { return model_; }
  // (sequence, kv head, layer) context parts attended through split-K since construction.
  int64_t split_attention_parts() const { return split_parts_; }
  // Split-K on (the default) or off, for benchmarks that time the one against the other.
  void set_split_attention(bool on) { split_attention_ = on; }
  // Decode steps sharing their first pages attend them in one walk (engine/runner/shared_prefix.h);
  // on by default, off for comparisons.
  void set_shared_prefix_attention(bool on) { shared_prefix_ = on; }
  // Shared-prefix walks (group, layer, kv head) run since construction.
  int64_t shared_prefix_walks() const { return shared_.walks(); }
  // The team path on (the default) or off, for tests and benchmarks that compare the two.
  void set_team(bool on) { team_ = on; }
  // Steps that ran on the team path since construction.
  int64_t team_steps() const { return team_steps_; }
  KvCache& cache() override { return *cache_; }
  // The pool must hold the row type and a demote= store (KvCache::CheckFormat); every policy
  // runs here.
  absl::Status SupportsPolicy(const EvictionPolicy* policy,
                              KvQuant quant = KvQuant::kNone) const override {
    return cache_->CheckFormat(policy, quant);
  }

 private:
  const Model& model_;
  KvCache* cache_;
  // Activations, sized for the largest step seen. Rows are tokens of the step.
  AlignedVector<float> x_;       // [T][dim] residual stream
  AlignedVector<float> xb_;      // [T][dim] normalised input of a sub-block
  AlignedVector<float> qkv_;     // [T][q_dim + 2*kv_dim]
  AlignedVector<float> att_;     // [T][q_dim]
  AlignedVector<float> hb_;      // [T][2*hidden]
  AlignedVector<float> hb2_;     // [T][hidden]
  AlignedVector<float> logits_;  // [rows][vocab]
  std::vector<int32_t> pos_;   // [T]
  AlignedVector<float> team_xb_;      // [threads][T][dim]: each team thread's normalised input
  std::vector<float> rope_angles_;    // [T][head_dim]: the team path's RopeAngles
  int64_t split_parts_ = 0;
  int64_t team_steps_ = 0;
  bool split_attention_ = true;
  bool shared_prefix_ = true;
  SharedPrefixAttention shared_;  // the step's plan and buffers, kept across steps
  bool team_ = true;
  bool team_weights_ = false;     // every layer matrix TeamCapable
  bool team_classifier_ = false;  // the classifier too: the team path runs it as well
};

}  // namespace heavykv
