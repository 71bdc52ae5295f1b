#include "kernels/cuda/rms_norm.cuh"

namespace heavykv::cuda {
namespace {

constexpr int kThreads = 256;

static __global__ void RmsNormKernel(const float* __restrict__ x, const float* __restrict__ w,
                                     bf16* __restrict__ out, int64_t dim, float eps,
                                     const int32_t* __restrict__ row_index) {
  const int64_t r = blockIdx.x;
  const int64_t src = row_index != nullptr ? row_index[r] : r;
  const float* xr = x + src * dim;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < dim; j += kThreads) ss += xr[j] * xr[j];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  __shared__ float warp_sum[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sum[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < kThreads / 32; ++i) total += warp_sum[i];
  const float scale = 1.0f / sqrtf(total / float(dim) + eps);
  for (int64_t j = threadIdx.x; j < dim; j += kThreads) {
    out[r * dim + j] = __float2bfloat16_rn(w[j] * (scale * xr[j]));
  }
}

}  // namespace

cudaError_t RmsNorm(const float* x, const float* w, bf16* out, int64_t rows, int64_t dim,
                    float eps, const int32_t* row_index, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  RmsNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, w, out, dim, eps, row_index);
  return cudaGetLastError();
}

}  // namespace heavykv::cuda
