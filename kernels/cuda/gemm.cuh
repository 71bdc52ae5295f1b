// The projections' GEMM through cuBLASLt: y = x W^T with bf16 x and W, fp32 accumulation and
// fp32 output, batched over every token of a step (m rows).
//
//   cublasLtHandle_t lt;  CreateGemmHandle(&lt);
//   GemmBf16(lt, ws, ws_bytes, x, w, y, m, n, k, /*ldy=*/n, /*accumulate=*/false, stream);
//   DestroyGemmHandle(lt);
//
// Returns cuBLAS's status (CUBLAS_STATUS_NOT_SUPPORTED when no algorithm fits,
// CUBLAS_STATUS_NOT_INITIALIZED when the library cannot be loaded); the caller turns it into an
// absl::Status at the backend boundary. Descriptors and the chosen algorithm are cached per shape
// and thread, so a decode step pays cuBLASLt's heuristic only once. With HEAVYKV_CUDA_GEMM_TUNE=1
// the first call of a shape also times the heuristic's first 8 algorithms on the stream (into the
// second half of the workspace, so the outputs are untouched) and keeps the fastest.
//
// libcublasLt is loaded with dlopen on first use instead of being linked: its 92 KiB of
// thread-local storage would otherwise be part of every thread's static TLS block from process
// start, and threads with small stacks (civetweb's 100 KiB, behind the metrics endpoint) then
// fail to start even when the CUDA backend is never used.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_kv.cuh"

namespace heavykv::cuda {

cublasStatus_t CreateGemmHandle(cublasLtHandle_t* handle);
void DestroyGemmHandle(cublasLtHandle_t handle);

// y[m][ldy] (+)= x[m][k] * w[n][k]^T, all row-major; ldy >= n. Pointers 16-byte aligned.
cublasStatus_t GemmBf16(cublasLtHandle_t lt, void* workspace, size_t workspace_bytes,
                        const bf16* x, const bf16* w, float* y, int64_t m, int64_t n, int64_t k,
                        int64_t ldy, bool accumulate, cudaStream_t stream);

}  // namespace heavykv::cuda
