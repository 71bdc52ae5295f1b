// Per-head eviction on the GPU, for one layer and every (sequence, kv head) of a step, with the
// semantics of KvCache::EvictHead (memory/kv_cache.h) and the policies' victims as one total order
// (kernels/cuda/eviction_rule.h):
//
//   held = num_old + num_new; if the sequence has a rule and held > budget, the head's
//   held - budget smallest EvictionKeys are its victims (a min reduction when there is one, a
//   radix select otherwise); then every victim slot below the budget (a hole, in slot order)
//   receives the K row, V row, pos and score of the next surviving slot at or beyond the budget.
//
// Runs right after the layer's attention, one block per (sequence, kv head), with no host round
// trip. The host only calls KvCache::Commit afterwards. A head that cannot find enough candidates
// (a broken invariant: the CPU aborts) sets *error to 1 and leaves its slots unchanged.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_kv.cuh"

namespace heavykv::cuda {

// `max_held` >= num_old + num_new of every sequence of the step (sizes shared memory).
cudaError_t EvictLayer(const DeviceKvPool& pool, const DeviceStep& step, int32_t layer,
                       int32_t max_held, int32_t* error, cudaStream_t stream);

}  // namespace heavykv::cuda
