#include "kernels/cuda/rope.cuh"

#include <cmath>

namespace heavykv::cuda {
namespace {

// One block per row; the frequencies come from the table, so a pair costs a multiply and a
// sin/cos (the per-element pow in double of the first version took 8 us a launch).
static __global__ void RopeKernel(float* __restrict__ x, int64_t row_stride, int32_t rot_dim,
                                  int32_t head_dim, const float* __restrict__ inv_freq,
                                  const int32_t* __restrict__ pos) {
  float* r = x + int64_t(blockIdx.x) * row_stride;
  const float p = static_cast<float>(pos[blockIdx.x]);
  for (int32_t i = 2 * int32_t(threadIdx.x); i < rot_dim; i += 2 * int32_t(blockDim.x)) {
    const float val = p * __ldg(inv_freq + (i % head_dim) / 2);
    const float c = cosf(val), s = sinf(val);
    const float2 v = *reinterpret_cast<const float2*>(r + i);
    *reinterpret_cast<float2*>(r + i) = make_float2(v.x * c - v.y * s, v.x * s + v.y * c);
  }
}

}  // namespace

std::vector<float> RopeInvFreq(int64_t head_dim) {
  std::vector<float> f(head_dim / 2);
  for (int64_t i = 0; i < head_dim; i += 2) {
    const float e = float(i) / float(head_dim);
    f[i / 2] = 1.0f / static_cast<float>(std::pow(10000.0, static_cast<double>(e)));
  }
  return f;
}

cudaError_t Rope(float* x, int64_t rows, int64_t row_stride, int64_t rot_dim, int64_t head_dim,
                 const float* inv_freq, const int32_t* pos, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const int threads = rot_dim >= 512 ? 256 : 64;
  RopeKernel<<<static_cast<unsigned>(rows), threads, 0, stream>>>(
      x, row_stride, static_cast<int32_t>(rot_dim), static_cast<int32_t>(head_dim), inv_freq, pos);
  return cudaGetLastError();
}

}  // namespace heavykv::cuda
