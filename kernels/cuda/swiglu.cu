#include "kernels/cuda/swiglu.cuh"

namespace heavykv::cuda {
namespace {

static __global__ void SwiGluKernel(const float* __restrict__ gu, bf16* __restrict__ out,
                                    int64_t hidden) {
  const int64_t t = blockIdx.y;
  const float* g = gu + t * 2 * hidden;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < hidden;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = g[i];
    out[t * hidden + i] = __float2bfloat16_rn(v * (1.0f / (1.0f + expf(-v))) * g[hidden + i]);
  }
}

}  // namespace

cudaError_t SwiGlu(const float* gu, bf16* out, int64_t rows, int64_t hidden, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const int threads = 256;
  const int64_t bx = (hidden + threads - 1) / threads;
  SwiGluKernel<<<dim3(static_cast<unsigned>(bx < 64 ? bx : 64), static_cast<unsigned>(rows)),
                 threads, 0, stream>>>(gu, out, hidden);
  return cudaGetLastError();
}

}  // namespace heavykv::cuda
