#include "kernels/cuda/synthetic_kv.cuh"

namespace heavykv::cuda {
namespace {

__device__ inline uint32_t Hash(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

__device__ inline float Uniform(uint64_t x) { return (Hash(x) >> 8) * (1.0f / 16777216.0f); }

// Block per (slot, layer * kv head).
static __global__ void FillKernel(DeviceKvPool pool, const int32_t* __restrict__ page_ids,
                                  uint64_t seed) {
  const int32_t s = blockIdx.x;
  const int32_t layer = blockIdx.y / pool.num_kv_heads, h = blockIdx.y % pool.num_kv_heads;
  const int32_t page = page_ids[s / pool.block_size], row = s % pool.block_size;
  const uint64_t base = (seed * 0x9e3779b97f4a7c15ull) ^ (uint64_t(blockIdx.y) << 40) ^
                        (uint64_t(s) << 12);
  for (int32_t which = 0; which < 2; ++which) {
    bf16* dst = pool.kv + pool.RowOffset(page, layer, h, which, row);
    for (int32_t d = threadIdx.x; d < pool.head_dim; d += blockDim.x) {
      dst[d] = __float2bfloat16_rn(2.0f * Uniform(base + which * 4096 + d) - 1.0f);
    }
  }
  if (threadIdx.x == 0) {
    const int64_t m = pool.MetaOffset(page, layer, h, row);
    pool.pos[m] = s;
    pool.score[m] = Uniform(base + 9999);
  }
}

}  // namespace

cudaError_t FillSyntheticKv(const DeviceKvPool& pool, const int32_t* page_ids, int32_t num_slots,
                            uint64_t seed, cudaStream_t stream) {
  if (num_slots <= 0) return cudaSuccess;
  FillKernel<<<dim3(num_slots, pool.num_layers * pool.num_kv_heads), 64, 0, stream>>>(
      pool, page_ids, seed);
  return cudaGetLastError();
}

}  // namespace heavykv::cuda
