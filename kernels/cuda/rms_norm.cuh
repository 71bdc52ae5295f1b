// RMSNorm of fp32 rows into bf16 GEMM inputs, with the arithmetic of kernels/cpu/ops.h:
// out = w * x / sqrt(mean(x^2) + eps), accumulated in fp32 (eps: the model's rms_norm_eps,
// llama2.c's 1e-5).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_kv.cuh"

namespace heavykv::cuda {

// For r < rows: out[r][:] = RmsNorm(x[src][:]) * w, src = row_index ? row_index[r] : r.
// x [*][dim] fp32, w [dim] fp32, out [rows][dim] bf16; row_index [rows] or null (the final norm
// gathers only the rows whose logits are wanted).
cudaError_t RmsNorm(const float* x, const float* w, bf16* out, int64_t rows, int64_t dim,
                    float eps, const int32_t* row_index, cudaStream_t stream);

}  // namespace heavykv::cuda
