#include "kernels/cuda/rope.cuh"

#include <cmath>

namespace heavykv::cuda {
namespace {

// One block per row; the frequencies come from the table, so a pair costs a multiply and a
// sin/cos (the per-element pow in double of the first version took 8 us a launch). Thread pair
// p = i / 2 of the row rotates entries (i, i + 1), or with kNeox, in head h = i / head_dim,
// entries j and j + head_dim / 2 of the head, j = (i mod head_dim) / 2: the same pair -> angle
// map, so both read inv_freq[(i mod head_dim) / 2].
template <bool kNeox>
static __global__ void RopeKernel(float* __restrict__ x, int64_t row_stride, int32_t rot_dim,
                                  int32_t head_dim, const float* __restrict__ inv_freq,
                                  const int32_t* __restrict__ pos) {
  float* r = x + int64_t(blockIdx.x) * row_stride;
  const float p = static_cast<float>(pos[blockIdx.x]);
  for (int32_t i = 2 * int32_t(threadIdx.x); i < rot_dim; i += 2 * int32_t(blockDim.x)) {
    const int32_t j = (i % head_dim) / 2;
    const float val = p * __ldg(inv_freq + j);
    const float c = cosf(val), s = sinf(val);
    if constexpr (kNeox) {
      float* h = r + (i - i % head_dim) + j;
      const float v0 = h[0], v1 = h[head_dim / 2];
      h[0] = v0 * c - v1 * s;
      h[head_dim / 2] = v0 * s + v1 * c;
    } else {
      const float2 v = *reinterpret_cast<const float2*>(r + i);
      *reinterpret_cast<float2*>(r + i) = make_float2(v.x * c - v.y * s, v.x * s + v.y * c);
    }
  }
}

}  // namespace

std::vector<float> RopeInvFreq(int64_t head_dim, float theta, const float* freq_factors) {
  std::vector<float> f(head_dim / 2);
  for (int64_t i = 0; i < head_dim; i += 2) {
    const float e = float(i) / float(head_dim);
    float freq = theta == 10000.0f
                     ? 1.0f / static_cast<float>(std::pow(10000.0, static_cast<double>(e)))
                     : 1.0f / powf(theta, e);
    if (freq_factors != nullptr) freq /= freq_factors[i / 2];
    f[i / 2] = freq;
  }
  return f;
}

cudaError_t Rope(float* x, int64_t rows, int64_t row_stride, int64_t rot_dim, int64_t head_dim,
                 const float* inv_freq, bool neox, const int32_t* pos, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const int threads = rot_dim >= 512 ? 256 : 64;
  const auto kernel = neox ? RopeKernel<true> : RopeKernel<false>;
  kernel<<<static_cast<unsigned>(rows), threads, 0, stream>>>(
      x, row_stride, static_cast<int32_t>(rot_dim), static_cast<int32_t>(head_dim), inv_freq, pos);
  return cudaGetLastError();
}

}  // namespace heavykv::cuda
