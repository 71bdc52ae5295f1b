// KV append: writes a step's new K and V rows (after RoPE) into the pages of their sequences as
// bf16, with each slot's position and a zero score, for one layer; RopeKvAppend also applies
// RoPE to the step's q and k first (the decode step's path: one launch instead of two). The pages
// were reserved by KvCache::Reserve before the step (the block tables in `step` cover them).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_kv.cuh"

namespace heavykv::cuda {

// qkv [num_tokens][qkv_stride] fp32: the K row of kv head h of token t at
// qkv + t * qkv_stride + k_offset + h * head_dim, its V row at ... + v_offset + h * head_dim.
cudaError_t KvAppend(const DeviceKvPool& pool, const DeviceStep& step, int32_t layer,
                     const float* qkv, int64_t qkv_stride, int64_t k_offset, int64_t v_offset,
                     cudaStream_t stream);

// Rope (rope.cuh) over the first k_offset + num_kv_heads * head_dim entries of each row (the
// query heads, then the kv heads' K) at the step's token positions, then KvAppend, in one launch:
// the same results as the two calls. inv_freq [head_dim / 2] is RopeInvFreq's table in device
// memory, `neox` Rope's pairing; k_offset, v_offset and qkv_stride are even and k_offset a
// multiple of head_dim.
cudaError_t RopeKvAppend(const DeviceKvPool& pool, const DeviceStep& step, int32_t layer,
                         float* qkv, int64_t qkv_stride, int64_t k_offset, int64_t v_offset,
                         const float* inv_freq, bool neox, cudaStream_t stream);

}  // namespace heavykv::cuda
