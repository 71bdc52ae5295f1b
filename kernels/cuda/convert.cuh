// fp32 -> bf16 conversion (round to nearest even), for activations and for weights on upload.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_kv.cuh"

namespace heavykv::cuda {

// out[i] = bf16(in[i]) for i < n.
cudaError_t ConvertF32ToBf16(const float* in, bf16* out, int64_t n, cudaStream_t stream);

}  // namespace heavykv::cuda
