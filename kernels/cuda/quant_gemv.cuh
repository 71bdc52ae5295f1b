// y = x W^T with W kept in its GGUF block format on the device (issue 32, `--gpu-weights
// quantized`): the decode-side kernel, dequantizing in registers. COMPILED, NEVER RUN ON A GPU:
// tests/cuda/quant_gemv_test.cc checks it against cpu::DequantizeRow when a device is present.
//
//   cuda::QuantMatrixView w{device_bytes, QuantBlockType::kQ4_K, n, k, row_bytes};
//   QuantGemv(w, x, y, m, /*ldy=*/n, /*accumulate=*/false, stream);   // m <= kQuantGemvTile
//
// One warp per output row; lane i takes chunks i, i + 32, ... of 8 elements of the row (four
// at a time, their loads issued together), decodes each from its block (quant_decode.cuh),
// multiplies it with the m tokens' bf16 activations in fp32, and the warp reduces by shuffles.
// Every weight byte is read from memory once per call, the warp's loads of one row contiguous.
// Known limits, to be measured (never run): one launch per matrix part (no CUDA graph), so a
// decode step of small matrices pays launch gaps; x is read from L1/L2 per chunk, not staged in
// shared memory; Q4_K/Q5_K lanes of sub-blocks 2p and 2p + 1 load the same quant bytes (one
// from L1).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_kv.cuh"
#include "kernels/cuda/quant_blocks.cuh"

namespace heavykv::cuda {

// Tokens per launch of QuantGemv (the accumulators of one warp live in registers).
inline constexpr int kQuantGemvTile = 8;

// y[m][ldy] (+)= x[m][k] * W[n][k]^T for 1 <= m <= kQuantGemvTile, k = w.cols (a multiple of
// the block). x bf16, 16-byte aligned, rows of k; y fp32, ldy >= n. cudaErrorInvalidValue for
// m outside [1, kQuantGemvTile], an unknown type, or k not whole blocks.
cudaError_t QuantGemv(const QuantMatrixView& w, const bf16* x, float* y, int64_t m, int64_t ldy,
                      bool accumulate, cudaStream_t stream);

}  // namespace heavykv::cuda
