// The host side of a CUDA step, in plain C++ (no CUDA headers, tested on the CPU):
//  - EvictRuleFor takes an EvictionPolicy's GPU rule (EvictionPolicy::GpuRule, whose kinds are
//    those of kernels/cuda/eviction_rule.h), or refuses a policy the GPU cannot run;
//  - BuildStepLayout packs a step's plan (kernels/cuda/device_kv.cuh DeviceStep: block tables as
//    indptr + page ids, per-sequence counts and rules, per-token sequence and position, the
//    tokens, and the token row of each logits row) into one int32 buffer, uploaded in one copy.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/runner/step_runner.h"
#include "memory/eviction_policy.h"

namespace heavykv {

struct EvictRule {
  int32_t kind = 0;   // cuda::EvictKind
  int32_t param = 0;  // first kept-from position (oldest) or recent tokens protected (h2o)
};

// kEvictNone for no policy or an unbounded budget; UNIMPLEMENTED for a policy the GPU lacks.
absl::StatusOr<EvictRule> EvictRuleFor(const EvictionPolicy* policy, int32_t budget);
// OK for no policy or one with a GPU rule; EvictRuleFor's UNIMPLEMENTED otherwise.
absl::Status CheckGpuPolicy(const EvictionPolicy* policy);

struct StepLayout {
  std::vector<int32_t> data;
  // Offsets into `data` of each array (see DeviceStep for their meaning and lengths).
  int64_t page_indptr = 0, page_ids = 0, num_old = 0, num_new = 0, token_begin = 0,
          start_pos = 0, token_seq = 0, token_pos = 0, accumulate = 0, budget = 0,
          evict_kind = 0, evict_param = 0;
  int64_t tokens = 0;      // [num_tokens] token ids
  int64_t logit_rows = 0;  // [num_rows] the token row whose logits each output row holds
  int32_t num_seqs = 0, num_tokens = 0, num_rows = 0;
  int32_t max_held = 0;    // largest num_old + num_new: the longest context of the step
  bool any_scores = false;
};

// `rules[i]` is EvictRuleFor(steps[i]). Call after KvCache::Reserve for every step: the block
// tables must cover num_slots + tokens.size() slots (INTERNAL otherwise).
absl::Status BuildStepLayout(std::span<const SequenceStep> steps, std::span<const EvictRule> rules,
                             int32_t block_size, StepLayout* out);

}  // namespace heavykv
