// RoPE in place on fp32 rows, as kernels/cpu/ops.h Rope: pairs (2i, 2i+1) of the first rot_dim
// entries rotate by pos * 10000^(-(2i mod head_dim) / head_dim).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace heavykv::cuda {

// x [rows][row_stride] fp32, pos [rows]; rot_dim and head_dim even.
cudaError_t Rope(float* x, int64_t rows, int64_t row_stride, int64_t rot_dim, int64_t head_dim,
                 const int32_t* pos, cudaStream_t stream);

}  // namespace heavykv::cuda
