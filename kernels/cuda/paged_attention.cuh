// Paged attention for grouped-query heads over the KV pool, for every token row of a step
// (decode tokens and prefill chunks alike; causal by slot as in kernels/cpu/paged_attention.h):
// token t of sequence i attends over slots [0, num_old[i] + (t - token_begin[i]) + 1).
//
// One block per (token, kv head, split): it reads the K and V rows of its split through the
// block table once for the whole query-head group and, when the sequence accumulates scores,
// adds to every slot's score the probability that slot received, summed over the group, in the
// same pass. Long contexts are split into chunks (split-K); each split's softmax is local to its
// chunk (max m_c, sum l_c), and a combine kernel rescales by exp(m_c - M) / L, where M and L are
// the global max and sum, both the outputs and the chunk's stored exp(logit - m_c) values before
// adding them to the scores. A context within one chunk needs no combine and no scratch.
//
// Three split kernels, chosen by the plan: kMma (the default; attention_mma.cuh) streams tiles of
// 16 keys per warp through tensor-core mma.sync with an online softmax (head_dim 64 and 128; the
// plan falls back to kStream for other head dims); kStream (attention_stream.cuh) streams each K
// and V row once per warp on the CUDA cores; kTwoPass (the first one) reads the chunk's K rows,
// normalises over shared memory between block barriers, then reads its V rows. The environment
// variable HEAVYKV_CUDA_ATTENTION=stream or =two-pass makes an older one the default, so that one
// benchmark binary measures them side by side.
//
//   AttentionPlan plan = PlanAttention(T, kv_heads, group, head_dim, max_keys, scores, sms);
//   (size scratch by plan), PagedAttention(args, plan, stream);
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_kv.cuh"

namespace heavykv::cuda {

inline constexpr int32_t kAttentionMaxGroup = 8;     // query heads per kv head
inline constexpr int32_t kAttentionMaxHeadDim = 256; // and a multiple of 8

enum class AttentionKernel { kMma, kStream, kTwoPass };

// kMma, or kStream / kTwoPass where HEAVYKV_CUDA_ATTENTION is "stream" / "two-pass" (read once
// per process).
AttentionKernel DefaultAttentionKernel();
const char* AttentionKernelName(AttentionKernel kernel);  // "mma", "stream", "two-pass"

struct AttentionPlan {
  AttentionKernel kernel = AttentionKernel::kStream;
  bool scores = false;     // planned with score accumulation (shared memory for the logits)
  int32_t chunk = 0;       // keys per split
  int32_t max_splits = 1;  // splits of the longest context
  int64_t part_out_floats = 0;  // scratch the launch needs (0 when max_splits == 1)
  int64_t part_ml_floats = 0;
  int64_t part_e_floats = 0;    // only with score accumulation
};

// Chooses the split size for `num_tokens` rows whose longest visible context is `max_keys`:
// chunks fit the logits of the group in shared memory (kTwoPass always, kStream and kMma with
// scores; kMma may use up to 112 KB of it, in chunks of at most 1024 keys). kTwoPass splits short
// batches further for about two blocks per SM; kStream and kMma pick the number of splits whose
// blocks fill the SMs' resident slots in whole waves best (fewest splits on a tie). The returned
// plan's kernel may differ from `kernel` (kMma -> kStream for a head_dim it does not take).
// `max_chunk` > 0 caps the chunk (tests force split-K).
AttentionPlan PlanAttention(int32_t num_tokens, int32_t num_kv_heads, int32_t group,
                            int32_t head_dim, int32_t max_keys, bool scores, int32_t num_sms,
                            int32_t max_chunk = 0,
                            AttentionKernel kernel = DefaultAttentionKernel());

struct AttentionArgs {
  DeviceKvPool pool;
  DeviceStep step;
  int32_t layer = 0;
  int32_t group = 1;
  // Query head qh = h * group + g of token t: q + t * q_stride + qh * head_dim  [head_dim] fp32.
  const float* q = nullptr;
  int64_t q_stride = 0;
  // Output with the layout of q, in bf16 (the input of the output projection).
  bf16* out = nullptr;
  int64_t out_stride = 0;
  // Scratch of AttentionPlan's sizes (device memory; may be null when the sizes are 0).
  float* part_out = nullptr;  // [num_tokens][num_kv_heads][max_splits][group][head_dim]
  float* part_ml = nullptr;   // [num_tokens][num_kv_heads][max_splits][group][2]
  float* part_e = nullptr;    // [num_tokens][num_kv_heads][max_splits][group][chunk]
};

// cudaErrorInvalidValue for a group or head_dim outside the limits above.
cudaError_t PagedAttention(const AttentionArgs& args, const AttentionPlan& plan,
                           cudaStream_t stream);

}  // namespace heavykv::cuda
