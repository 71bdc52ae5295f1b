#include "kernels/cuda/kv_append.cuh"

namespace heavykv::cuda {
namespace {

static __global__ void KvAppendKernel(DeviceKvPool pool, DeviceStep step, int32_t layer,
                                      const float* __restrict__ qkv, int64_t qkv_stride,
                                      int64_t k_offset, int64_t v_offset) {
  const int32_t t = blockIdx.x, h = blockIdx.y, hd = pool.head_dim, bs = pool.block_size;
  const int32_t seq = step.token_seq[t];
  const int32_t slot = step.num_old[seq] + (t - step.token_begin[seq]);
  const int32_t page = step.page_ids[step.page_indptr[seq] + slot / bs];
  const int32_t row = slot % bs;
  const float* k = qkv + int64_t(t) * qkv_stride + k_offset + int64_t(h) * hd;
  const float* v = qkv + int64_t(t) * qkv_stride + v_offset + int64_t(h) * hd;
  bf16* kd = pool.kv + pool.RowOffset(page, layer, h, 0, row);
  bf16* vd = pool.kv + pool.RowOffset(page, layer, h, 1, row);
  for (int32_t d = threadIdx.x; d < hd; d += blockDim.x) {
    kd[d] = __float2bfloat16_rn(k[d]);
    vd[d] = __float2bfloat16_rn(v[d]);
  }
  if (threadIdx.x == 0) {
    const int64_t m = pool.MetaOffset(page, layer, h, row);
    pool.pos[m] = step.token_pos[t];
    pool.score[m] = 0.0f;
  }
}

}  // namespace

cudaError_t KvAppend(const DeviceKvPool& pool, const DeviceStep& step, int32_t layer,
                     const float* qkv, int64_t qkv_stride, int64_t k_offset, int64_t v_offset,
                     cudaStream_t stream) {
  if (step.num_tokens <= 0) return cudaSuccess;
  const int threads = pool.head_dim < 128 ? 32 : 128;
  KvAppendKernel<<<dim3(step.num_tokens, pool.num_kv_heads), threads, 0, stream>>>(
      pool, step, layer, qkv, qkv_stride, k_offset, v_offset);
  return cudaGetLastError();
}

}  // namespace heavykv::cuda
