// RoPE in place on fp32 rows, as kernels/cpu/ops.h Rope: interleaved pairs (2i, 2i+1) of each
// head_dim-wide head (llama2.c, llama.cpp's NORM), or with `neox` pairs (i, i + head_dim/2)
// (Qwen, GPT-NeoX), of the first rot_dim entries, rotate by pos * inv_freq[i], where inv_freq
// holds theta^(-2i/head_dim), divided by a per-pair factor where the model has rope_freqs.
//
//   std::vector<float> f = RopeInvFreq(head_dim, theta, factors);  // once per model, uploaded
//   Rope(x, rows, row_stride, rot_dim, head_dim, d_f, neox, pos, stream);   // each step
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace heavykv::cuda {

// The inverse frequencies [head_dim / 2], computed on the host with the float values the CPU's
// Rope uses: 1 / powf(theta, 2i / head_dim), then divided by freq_factors[i] (Llama 3.1's
// rope_freqs, [head_dim / 2]) when it is not null. For theta 10000 (llama2.c) through pow in
// double rounded once: glibc's powf is correctly rounded there, so this gives the same floats for
// every even index of every head_dim up to 256 on any host libm; other thetas call powf as the
// CPU does. CUDA's powf is a few ulp off, and one ulp is ~0.015 rad at position 131071, so the
// table is never computed on the device.
std::vector<float> RopeInvFreq(int64_t head_dim, float theta = 10000.0f,
                               const float* freq_factors = nullptr);

// x [rows][row_stride] fp32, inv_freq [head_dim / 2] (RopeInvFreq, device memory), pos [rows];
// rot_dim a multiple of head_dim, head_dim and row_stride even (interleaved pairs are read as
// float2).
cudaError_t Rope(float* x, int64_t rows, int64_t row_stride, int64_t rot_dim, int64_t head_dim,
                 const float* inv_freq, bool neox, const int32_t* pos, cudaStream_t stream);

}  // namespace heavykv::cuda
