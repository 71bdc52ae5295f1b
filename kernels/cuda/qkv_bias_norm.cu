#include "kernels/cuda/qkv_bias_norm.cuh"

namespace heavykv::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kPerLane = kQkvNormMaxHeadDim / 32;

// One block per row, one warp per head (heads strided over the block's warps): the head's
// entries sit in the warp's registers (entry lane + 32 * i), so the bias, the sum of squares and
// the scaling read and write each entry once.
static __global__ void QkvBiasNormKernel(float* __restrict__ qkv, int64_t row_stride,
                                         const float* __restrict__ bias,
                                         const float* __restrict__ q_norm,
                                         const float* __restrict__ k_norm, int32_t num_heads,
                                         int32_t num_kv_heads, int32_t head_dim, float eps) {
  float* row = qkv + int64_t(blockIdx.x) * row_stride;
  const int32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int32_t heads = bias != nullptr ? num_heads + 2 * num_kv_heads : num_heads + num_kv_heads;
  for (int32_t h = warp; h < heads; h += kWarps) {
    float* x = row + int64_t(h) * head_dim;
    const float* b = bias != nullptr ? bias + int64_t(h) * head_dim : nullptr;
    float v[kPerLane];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int32_t j = lane + 32 * i;
      v[i] = 0.0f;
      if (j < head_dim) {
        v[i] = x[j];
        if (b != nullptr) v[i] += b[j];
        ss += v[i] * v[i];
      }
    }
    const float* w = h < num_heads ? q_norm : (h < num_heads + num_kv_heads ? k_norm : nullptr);
    if (w != nullptr) {
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      const float scale = 1.0f / sqrtf(ss / float(head_dim) + eps);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int32_t j = lane + 32 * i;
        if (j < head_dim) v[i] = w[j] * (scale * v[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int32_t j = lane + 32 * i;
      if (j < head_dim) x[j] = v[i];
    }
  }
}

}  // namespace

cudaError_t QkvBiasNorm(float* qkv, int64_t rows, int64_t row_stride, const float* bias,
                        const float* q_norm, const float* k_norm, int32_t num_heads,
                        int32_t num_kv_heads, int32_t head_dim, float eps, cudaStream_t stream) {
  if (head_dim <= 0 || head_dim > kQkvNormMaxHeadDim || (q_norm == nullptr) != (k_norm == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (rows <= 0 || (bias == nullptr && q_norm == nullptr)) return cudaSuccess;
  QkvBiasNormKernel<<<static_cast<unsigned>(rows), 32 * kWarps, 0, stream>>>(
      qkv, row_stride, bias, q_norm, k_norm, num_heads, num_kv_heads, head_dim, eps);
  return cudaGetLastError();
}

}  // namespace heavykv::cuda
