#include "kernels/cuda/quant_dequant.cuh"

#include "kernels/cuda/quant_decode.cuh"

namespace heavykv::cuda {
namespace {

// One thread per chunk of 8 elements of the slab: decode, round, one 16-byte store.
template <QuantBlockType T>
static __global__ void DequantizeBf16Kernel(const uint8_t* __restrict__ w, int64_t row_bytes,
                                            int64_t k, int64_t rows, bf16* __restrict__ out) {
  constexpr int kChunksPerBlock = QuantBlockTraits<T>::kElems / 8;
  constexpr int kBlockBytes = QuantBlockTraits<T>::kBytes;
  const int64_t chunks_per_row = k / 8;
  const int64_t total = rows * chunks_per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / chunks_per_row, c = i - r * chunks_per_row;
    const int64_t blk = c / kChunksPerBlock;
    float v[8];
    DecodeChunk<T>(w + r * row_bytes + blk * kBlockBytes, int(c - blk * kChunksPerBlock), v);
    uint4 packed;
    __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
    for (int j = 0; j < 4; ++j) p[j] = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
    *reinterpret_cast<uint4*>(out + r * k + c * 8) = packed;
  }
}

// One block per token; threads walk the row's chunks.
template <QuantBlockType T>
static __global__ void QuantEmbeddingKernel(const uint8_t* __restrict__ w, int64_t row_bytes,
                                            int64_t k, const int32_t* __restrict__ tokens,
                                            float* __restrict__ out) {
  constexpr int kChunksPerBlock = QuantBlockTraits<T>::kElems / 8;
  constexpr int kBlockBytes = QuantBlockTraits<T>::kBytes;
  const int64_t t = blockIdx.x;
  const uint8_t* row = w + int64_t(tokens[t]) * row_bytes;
  for (int64_t c = threadIdx.x; c < k / 8; c += blockDim.x) {
    const int64_t blk = c / kChunksPerBlock;
    float v[8];
    DecodeChunk<T>(row + blk * kBlockBytes, int(c - blk * kChunksPerBlock), v);
#pragma unroll
    for (int j = 0; j < 8; ++j) out[t * k + c * 8 + j] = v[j];
  }
}

template <QuantBlockType T>
cudaError_t LaunchDequant(const QuantMatrixView& w, int64_t row0, int64_t rows, bf16* out,
                          cudaStream_t stream) {
  const int threads = 256;
  const int64_t total = rows * (w.cols / 8);
  const int64_t blocks = (total + threads - 1) / threads;
  DequantizeBf16Kernel<T>
      <<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), threads, 0, stream>>>(
          w.data + row0 * w.row_bytes, w.row_bytes, w.cols, rows, out);
  return cudaGetLastError();
}

template <QuantBlockType T>
cudaError_t LaunchEmbedding(const QuantMatrixView& w, const int32_t* tokens, float* out,
                            int64_t num_tokens, cudaStream_t stream) {
  QuantEmbeddingKernel<T><<<static_cast<unsigned>(num_tokens), 256, 0, stream>>>(
      w.data, w.row_bytes, w.cols, tokens, out);
  return cudaGetLastError();
}

bool ValidView(const QuantMatrixView& w) {
  const int elems = QuantBlockElemsOf(w.type);
  return elems != 0 && w.cols % elems == 0 &&
         w.row_bytes == w.cols / elems * QuantBlockBytesOf(w.type);
}

}  // namespace

cudaError_t DequantizeBf16(const QuantMatrixView& w, int64_t row0, int64_t rows, bf16* out,
                           cudaStream_t stream) {
  if (!ValidView(w) || row0 < 0 || rows < 0 || row0 + rows > w.rows) return cudaErrorInvalidValue;
  if (rows == 0 || w.cols == 0) return cudaSuccess;
  return WithBlockType(w.type, cudaErrorInvalidValue, [&](auto type) {
    return LaunchDequant<decltype(type)::value>(w, row0, rows, out, stream);
  });
}

cudaError_t QuantEmbedding(const QuantMatrixView& w, const int32_t* tokens, float* out,
                           int64_t num_tokens, cudaStream_t stream) {
  if (!ValidView(w)) return cudaErrorInvalidValue;
  if (num_tokens <= 0 || w.cols == 0) return cudaSuccess;
  return WithBlockType(w.type, cudaErrorInvalidValue, [&](auto type) {
    return LaunchEmbedding<decltype(type)::value>(w, tokens, out, num_tokens, stream);
  });
}

}  // namespace heavykv::cuda
