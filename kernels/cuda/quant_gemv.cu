#include "kernels/cuda/quant_gemv.cuh"

#include "kernels/cuda/quant_decode.cuh"

namespace heavykv::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kUnroll = 4;

template <QuantBlockType T, int M>
static __global__ void __launch_bounds__(kWarpsPerBlock * 32)
    QuantGemvKernel(const uint8_t* __restrict__ w, int64_t row_bytes, int64_t n, int64_t k,
                    const bf16* __restrict__ x, float* __restrict__ y, int64_t ldy,
                    bool accumulate) {
  constexpr int kChunksPerBlock = QuantBlockTraits<T>::kElems / 8;
  constexpr int kBlockBytes = QuantBlockTraits<T>::kBytes;
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= n) return;
  const uint8_t* wr = w + row * row_bytes;
  const int64_t chunks = k / 8;
  float acc[M];
#pragma unroll
  for (int t = 0; t < M; ++t) acc[t] = 0.0f;
  // kUnroll chunks per lane per iteration, decoded before any is used, so that each warp has
  // kUnroll independent weight loads in flight (a 2048-row matrix gives an SM only ~16 warps).
  for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kUnroll) {
    float v[kUnroll][8];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + 32 * u;
      if (c < chunks) {
        const int64_t blk = c / kChunksPerBlock;
        DecodeChunk<T>(wr + blk * kBlockBytes, int(c - blk * kChunksPerBlock), v[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + 32 * u;
      if (c >= chunks) break;
#pragma unroll
      for (int t = 0; t < M; ++t) {
        const uint4 raw = *reinterpret_cast<const uint4*>(x + t * k + c * 8);
        const __nv_bfloat162* xs = reinterpret_cast<const __nv_bfloat162*>(&raw);
        float s = acc[t];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 f = __bfloat1622float2(xs[i]);
          s = fmaf(v[u][2 * i], f.x, s);
          s = fmaf(v[u][2 * i + 1], f.y, s);
        }
        acc[t] = s;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < M; ++t) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[t] += __shfl_xor_sync(0xFFFFFFFFu, acc[t], o);
  }
  if (lane == 0) {
#pragma unroll
    for (int t = 0; t < M; ++t) {
      float* out = y + t * ldy + row;
      *out = accumulate ? *out + acc[t] : acc[t];
    }
  }
}

template <QuantBlockType T>
cudaError_t Launch(const QuantMatrixView& w, const bf16* x, float* y, int64_t m, int64_t ldy,
                   bool accumulate, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((w.rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const dim3 grid(blocks), block(kWarpsPerBlock * 32);
#define HEAVYKV_QUANT_GEMV_CASE(M)                                                                \
  case M:                                                                                         \
    QuantGemvKernel<T, M>                                                                         \
        <<<grid, block, 0, stream>>>(w.data, w.row_bytes, w.rows, w.cols, x, y, ldy, accumulate); \
    break;
  switch (m) {
    HEAVYKV_QUANT_GEMV_CASE(1)
    HEAVYKV_QUANT_GEMV_CASE(2)
    HEAVYKV_QUANT_GEMV_CASE(3)
    HEAVYKV_QUANT_GEMV_CASE(4)
    HEAVYKV_QUANT_GEMV_CASE(5)
    HEAVYKV_QUANT_GEMV_CASE(6)
    HEAVYKV_QUANT_GEMV_CASE(7)
    HEAVYKV_QUANT_GEMV_CASE(8)
    default:
      return cudaErrorInvalidValue;
  }
#undef HEAVYKV_QUANT_GEMV_CASE
  return cudaGetLastError();
}

}  // namespace

cudaError_t QuantGemv(const QuantMatrixView& w, const bf16* x, float* y, int64_t m, int64_t ldy,
                      bool accumulate, cudaStream_t stream) {
  static_assert(kQuantGemvTile == 8, "Launch instantiates M = 1..8");
  const int elems = QuantBlockElemsOf(w.type);
  if (m < 1 || m > kQuantGemvTile || elems == 0 || w.cols % elems != 0 || ldy < w.rows) {
    return cudaErrorInvalidValue;
  }
  if (w.rows <= 0) return cudaSuccess;
  return WithBlockType(w.type, cudaErrorInvalidValue, [&](auto type) {
    return Launch<decltype(type)::value>(w, x, y, m, ldy, accumulate, stream);
  });
}

}  // namespace heavykv::cuda
