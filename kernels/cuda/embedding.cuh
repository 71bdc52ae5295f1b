// Embedding lookup: rows of a bf16 token table into the fp32 residual stream.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_kv.cuh"

namespace heavykv::cuda {

// out[t][:] = table[tokens[t]][:] for t < rows. table [vocab][dim] bf16, out [rows][dim] fp32.
// Token ids are validated by the caller.
cudaError_t Embedding(const bf16* table, const int32_t* tokens, float* out, int64_t rows,
                      int64_t dim, cudaStream_t stream);

}  // namespace heavykv::cuda
