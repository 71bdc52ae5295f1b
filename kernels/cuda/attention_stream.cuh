// The single-pass ("stream") decode attention kernel behind PagedAttention (paged_attention.cuh
// is the interface; this header is internal to kernels/cuda). One block per (token, kv head,
// split) as in the two-pass kernel, but each warp streams its keys once: it loads the K and V
// rows of kStreamUnroll keys per lane group together, folds them into a running (max, sum,
// output) with an online softmax, and never waits at a block barrier inside the loop. The warps
// meet once at the end. With score accumulation each key's logit is also kept in shared memory
// ([group][chunk] fp32), so that the block (one split) or the combine kernel (several) can add
// each slot's final probability to its score after the pass: the K/V bytes are still read once.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/paged_attention.cuh"

namespace heavykv::cuda::internal {

inline constexpr int32_t kStreamWarps = 4;
inline constexpr int32_t kStreamThreads = kStreamWarps * 32;

// Dynamic shared memory of one block: per-warp partial outputs and (max, sum), the block's
// (max, sum), q of the group, and with scores `logit_keys` fp32 logits per group head.
inline int64_t StreamSmemBytes(int32_t group, int32_t head_dim, int32_t logit_keys) {
  return (int64_t(kStreamWarps) * group * (head_dim + 2) + 2 * group + int64_t(group) * head_dim +
          int64_t(group) * logit_keys) * int64_t(sizeof(float));
}

// Resident blocks per SM for `smem_bytes` of dynamic shared memory (registers and shared
// memory); 0 where it cannot be known (no device).
int32_t StreamBlocksPerSm(int32_t group, int64_t smem_bytes);

// Launches the split kernel only (PagedAttention adds the combine); plan.kernel == kStream.
cudaError_t LaunchAttentionStream(const AttentionArgs& args, const AttentionPlan& plan,
                                  cudaStream_t stream);

}  // namespace heavykv::cuda::internal
