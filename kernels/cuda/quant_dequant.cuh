// The two other uses of a matrix kept in its GGUF block format on the device (issue 32):
// DequantizeBf16 writes a slab of rows as bf16, for the large-batch path (slab, then the cuBLASLt
// GEMM on tensor cores, gemm.cuh); QuantEmbedding decodes token rows straight into the fp32
// residual stream (a quantized token_embd, or a shared quantized classifier). COMPILED, NEVER RUN
// ON A GPU: tests/cuda/quant_gemv_test.cc checks both against cpu::DequantizeRow with a device.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_kv.cuh"
#include "kernels/cuda/quant_blocks.cuh"

namespace heavykv::cuda {

// out[r][k] = bf16(W[row0 + r][:]) for r < rows (round to nearest even), out 16-byte aligned,
// rows of k = w.cols. cudaErrorInvalidValue for an unknown type or rows outside the matrix.
cudaError_t DequantizeBf16(const QuantMatrixView& w, int64_t row0, int64_t rows, bf16* out,
                           cudaStream_t stream);

// out[t][:] = W[tokens[t]][:] in fp32 for t < num_tokens; out [num_tokens][w.cols]. Token ids are
// validated by the caller (0 <= id < w.rows).
cudaError_t QuantEmbedding(const QuantMatrixView& w, const int32_t* tokens, float* out,
                           int64_t num_tokens, cudaStream_t stream);

}  // namespace heavykv::cuda
