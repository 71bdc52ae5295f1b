// SwiGLU of the fused gate/up GEMM output into the bf16 input of the down projection.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_kv.cuh"

namespace heavykv::cuda {

// out[t][i] = silu(gu[t][i]) * gu[t][hidden + i]; gu [rows][2*hidden] fp32, out [rows][hidden].
cudaError_t SwiGlu(const float* gu, bf16* out, int64_t rows, int64_t hidden, cudaStream_t stream);

}  // namespace heavykv::cuda
