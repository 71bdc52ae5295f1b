#include "kernels/cuda/convert.cuh"

namespace heavykv::cuda {
namespace {

static __global__ void ConvertKernel(const float* __restrict__ in, bf16* __restrict__ out,
                                     int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(in[i]);
  }
}

}  // namespace

cudaError_t ConvertF32ToBf16(const float* in, bf16* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const int threads = 256;
  const int64_t blocks = (n + threads - 1) / threads;
  ConvertKernel<<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), threads, 0, stream>>>(
      in, out, n);
  return cudaGetLastError();
}

}  // namespace heavykv::cuda
