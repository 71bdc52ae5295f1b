#include "kernels/cuda/embedding.cuh"

namespace heavykv::cuda {
namespace {

static __global__ void EmbeddingKernel(const bf16* __restrict__ table,
                                       const int32_t* __restrict__ tokens, float* __restrict__ out,
                                       int64_t dim) {
  const int64_t t = blockIdx.x;
  const bf16* row = table + int64_t(tokens[t]) * dim;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    out[t * dim + j] = __bfloat162float(row[j]);
  }
}

}  // namespace

cudaError_t Embedding(const bf16* table, const int32_t* tokens, float* out, int64_t rows,
                      int64_t dim, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  EmbeddingKernel<<<static_cast<unsigned>(rows), 256, 0, stream>>>(table, tokens, out, dim);
  return cudaGetLastError();
}

}  // namespace heavykv::cuda
