// The tensor-core ("mma") decode attention kernel behind PagedAttention (paged_attention.cuh is
// the interface; this header is internal to kernels/cuda). Same blocks, plan and combine as the
// stream kernel (attention_stream.cuh), but each warp takes tiles of 16 keys of one page and
// computes q.K^T and P.V with mma.sync m16n8k16 (bf16 in, fp32 accumulate): the group's <= 8
// query heads pad the M dimension of q.K^T, and P.V is computed transposed (O^T = V^T P^T) so
// that the logits' accumulator is P's operand without a shuffle. K and V rows go from global
// memory straight into operand registers (16-byte loads; head dimensions are permuted
// consistently between q and K, and between V and the output, so that no transpose is needed).
// q is split into two bf16 halves (hi + lo) so that the fp32 logits, and the H2O scores computed
// from them, keep ~16 bits of q's mantissa; P enters P.V in bf16. With scores the logits are kept
// in shared memory as in the stream kernel; the planner keeps chunks to 1024 keys then (longer
// ones cost residency: run 5), which for 8 heads of 128 dims still needs more than the default
// 48 KB, hence the opt-in budget kMmaSmemBudget.
// Shapes: head_dim 64 or 128 (MmaSupports; the planner uses the stream kernel for the others) and
// chunks a multiple of 16 keys; any block_size (a tile's 16 rows are addressed once when pages
// hold a multiple of 16 keys, row by row otherwise).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/paged_attention.cuh"

namespace heavykv::cuda::internal {

inline constexpr int32_t kMmaWarps = 4;
inline constexpr int32_t kMmaThreads = kMmaWarps * 32;
inline constexpr int64_t kMmaSmemBudget = 112 * 1024;  // opt-in dynamic shared memory per block

inline bool MmaSupports(int32_t head_dim) { return head_dim == 64 || head_dim == 128; }

// Dynamic shared memory of one block: per-warp partial outputs and (max, sum), q of 8 (padded)
// heads as bf16 hi and lo, the block's (max, sum), and with scores `logit_keys` fp32 logits per
// group head.
inline int64_t MmaSmemBytes(int32_t group, int32_t head_dim, int32_t logit_keys) {
  return (int64_t(kMmaWarps) * group * (head_dim + 2) + 8 * int64_t(head_dim) + 2 * group +
          int64_t(group) * logit_keys) *
         int64_t(sizeof(float));
}

// Resident blocks per SM for `smem_bytes` of dynamic shared memory; 0 where it cannot be known.
int32_t MmaBlocksPerSm(int32_t head_dim, int64_t smem_bytes);

// Launches the split kernel only (PagedAttention adds the combine); plan.kernel == kMma.
cudaError_t LaunchAttentionMma(const AttentionArgs& args, const AttentionPlan& plan,
                               cudaStream_t stream);

}  // namespace heavykv::cuda::internal
