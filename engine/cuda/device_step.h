// DeviceStep view of a StepLayout whose integer buffer (StepLayout::data) has been copied to the
// device at `base`: every array of the step plan, as the kernels see it.
#pragma once

#include <cstdint>

#include "engine/cuda/step_layout.h"
#include "kernels/cuda/device_kv.cuh"

namespace heavykv {

inline cuda::DeviceStep DeviceStepAt(const StepLayout& layout, const int32_t* base) {
  cuda::DeviceStep step;
  step.num_seqs = layout.num_seqs;
  step.num_tokens = layout.num_tokens;
  step.page_indptr = base + layout.page_indptr;
  step.page_ids = base + layout.page_ids;
  step.num_old = base + layout.num_old;
  step.num_new = base + layout.num_new;
  step.token_begin = base + layout.token_begin;
  step.start_pos = base + layout.start_pos;
  step.token_seq = base + layout.token_seq;
  step.token_pos = base + layout.token_pos;
  step.accumulate = base + layout.accumulate;
  step.budget = base + layout.budget;
  step.evict_kind = base + layout.evict_kind;
  step.evict_param = base + layout.evict_param;
  return step;
}

}  // namespace heavykv
