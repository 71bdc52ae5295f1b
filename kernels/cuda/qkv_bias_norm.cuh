// The steps between the QKV GEMM and RoPE that some architectures add, in place on the fp32 qkv
// rows, with the arithmetic of engine/runner/model_runner.cc's CPU forward: the q/k/v bias (Qwen2:
// x += b, kernels/cpu/ops.h Add), then the per-head RMSNorm of every query and key head (Qwen3:
// kernels/cpu/ops.h RmsNorm over head_dim entries with one [head_dim] weight for all q heads and
// one for all k heads). The Llama block has neither and does not launch it.
//
//   QkvBiasNorm(qkv, T, qkv_dim, bqkv_or_null, q_norm_or_null, k_norm_or_null, heads, kv_heads,
//               head_dim, eps, stream);   // after the QKV GEMM, before RopeKvAppend
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace heavykv::cuda {

// The largest head_dim QkvBiasNorm takes (a warp holds a head in registers).
inline constexpr int32_t kQkvNormMaxHeadDim = 256;

// qkv [rows][row_stride] fp32: each row is num_heads query heads, then num_kv_heads key heads,
// then num_kv_heads value heads, each [head_dim], from entry 0. bias [(num_heads + 2 *
// num_kv_heads) * head_dim] or null: added to every entry of the row's heads. q_norm / k_norm
// [head_dim] or both null: each query head (key head) then becomes q_norm * x / sqrt(mean(x^2) +
// eps) (k_norm ...). cudaErrorInvalidValue for head_dim above kQkvNormMaxHeadDim.
cudaError_t QkvBiasNorm(float* qkv, int64_t rows, int64_t row_stride, const float* bias,
                        const float* q_norm, const float* k_norm, int32_t num_heads,
                        int32_t num_kv_heads, int32_t head_dim, float eps, cudaStream_t stream);

}  // namespace heavykv::cuda
