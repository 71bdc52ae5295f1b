#include "kernels/cuda/rope.cuh"

namespace heavykv::cuda {
namespace {

static __global__ void RopeKernel(float* __restrict__ x, int64_t row_stride, int64_t rot_dim,
                                  int64_t head_dim, const int32_t* __restrict__ pos) {
  const int64_t t = blockIdx.x;
  float* r = x + t * row_stride;
  const float p = static_cast<float>(pos[t]);
  for (int64_t i = 2 * int64_t(threadIdx.x); i < rot_dim; i += 2 * int64_t(blockDim.x)) {
    const int64_t fi = i % head_dim;  // the even index the frequency belongs to
    // The CPU's 1 / powf(10000, e), whose glibc powf is correctly rounded. CUDA's powf is not (a
    // few ulp), and an ulp of freq is ~0.015 rad at position 131071: with powf the parity test
    // measured 2.4e-5-2.6e-5 against its 2e-5 on the H200 (2026-12-04). pow in double, rounded
    // once, gives glibc's float for every even index of every head_dim up to 256 (checked on
    // the host); this kernel is a negligible part of a step.
    const float e = float(fi) / float(head_dim);
    const float freq = 1.0f / static_cast<float>(pow(10000.0, static_cast<double>(e)));
    const float val = p * freq;
    const float c = cosf(val), s = sinf(val);
    const float v0 = r[i], v1 = r[i + 1];
    r[i] = v0 * c - v1 * s;
    r[i + 1] = v0 * s + v1 * c;
  }
}

}  // namespace

cudaError_t Rope(float* x, int64_t rows, int64_t row_stride, int64_t rot_dim, int64_t head_dim,
                 const int32_t* pos, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  RopeKernel<<<static_cast<unsigned>(rows), 256, 0, stream>>>(x, row_stride, rot_dim, head_dim,
                                                              pos);
  return cudaGetLastError();
}

}  // namespace heavykv::cuda
