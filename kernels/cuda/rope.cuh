// RoPE in place on fp32 rows, as kernels/cpu/ops.h Rope: pairs (2i, 2i+1) of the first rot_dim
// entries rotate by pos * 10000^(-(2i mod head_dim) / head_dim).
//
//   std::vector<float> f = RopeInvFreq(head_dim);   // once per model, uploaded to the device
//   Rope(x, rows, row_stride, rot_dim, head_dim, d_f, pos, stream);   // each step
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace heavykv::cuda {

// The inverse frequencies [head_dim / 2]: the CPU's 1 / powf(10000, 2i / head_dim), whose glibc
// powf is correctly rounded; computed through pow in double and rounded once, which gives the
// same floats for every even index of every head_dim up to 256 (CUDA's powf is a few ulp off,
// and one ulp is ~0.015 rad at position 131071).
std::vector<float> RopeInvFreq(int64_t head_dim);

// x [rows][row_stride] fp32, inv_freq [head_dim / 2] (RopeInvFreq, device memory), pos [rows];
// rot_dim, head_dim and row_stride even (pairs are read as float2).
cudaError_t Rope(float* x, int64_t rows, int64_t row_stride, int64_t rot_dim, int64_t head_dim,
                 const float* inv_freq, const int32_t* pos, cudaStream_t stream);

}  // namespace heavykv::cuda
