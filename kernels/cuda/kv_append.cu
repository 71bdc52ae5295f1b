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

// One block per token row: RoPE on its q and k pairs in place (as RopeKernel, from the same
// table), each rotated k pair also stored to its page as bf16, then the V row and the metadata.
static __global__ void RopeKvAppendKernel(DeviceKvPool pool, DeviceStep step, int32_t layer,
                                          float* __restrict__ qkv, int64_t qkv_stride,
                                          int32_t k_offset, int32_t v_offset,
                                          const float* __restrict__ inv_freq) {
  const int32_t t = blockIdx.x, hd = pool.head_dim, bs = pool.block_size;
  const int32_t kv_dim = pool.num_kv_heads * hd;
  const int32_t seq = step.token_seq[t];
  const int32_t slot = step.num_old[seq] + (t - step.token_begin[seq]);
  const int32_t page = step.page_ids[step.page_indptr[seq] + slot / bs];
  const int32_t row = slot % bs;
  float* x = qkv + int64_t(t) * qkv_stride;
  const float p = static_cast<float>(step.token_pos[t]);
  for (int32_t i = 2 * int32_t(threadIdx.x); i < k_offset + kv_dim; i += 2 * int32_t(blockDim.x)) {
    const float val = p * __ldg(inv_freq + (i % hd) / 2);
    const float c = cosf(val), s = sinf(val);
    const float2 v = *reinterpret_cast<const float2*>(x + i);
    const float2 r = make_float2(v.x * c - v.y * s, v.x * s + v.y * c);
    *reinterpret_cast<float2*>(x + i) = r;
    if (i >= k_offset) {
      const int32_t e = i - k_offset;
      *reinterpret_cast<__nv_bfloat162*>(pool.kv + pool.RowOffset(page, layer, e / hd, 0, row) +
                                         e % hd) = __floats2bfloat162_rn(r.x, r.y);
    }
  }
  for (int32_t e = 2 * int32_t(threadIdx.x); e < kv_dim; e += 2 * int32_t(blockDim.x)) {
    const float2 v = *reinterpret_cast<const float2*>(x + v_offset + e);
    *reinterpret_cast<__nv_bfloat162*>(pool.kv + pool.RowOffset(page, layer, e / hd, 1, row) +
                                       e % hd) = __floats2bfloat162_rn(v.x, v.y);
  }
  if (threadIdx.x < pool.num_kv_heads) {
    const int64_t m = pool.MetaOffset(page, layer, threadIdx.x, row);
    pool.pos[m] = step.token_pos[t];
    pool.score[m] = 0.0f;
  }
}

}  // namespace

cudaError_t RopeKvAppend(const DeviceKvPool& pool, const DeviceStep& step, int32_t layer,
                         float* qkv, int64_t qkv_stride, int64_t k_offset, int64_t v_offset,
                         const float* inv_freq, cudaStream_t stream) {
  if (step.num_tokens <= 0) return cudaSuccess;
  if (k_offset % pool.head_dim != 0 || k_offset % 2 || v_offset % 2 || qkv_stride % 2) {
    return cudaErrorInvalidValue;
  }
  const int threads = k_offset + pool.num_kv_heads * pool.head_dim >= 1024 ? 256 : 64;
  RopeKvAppendKernel<<<step.num_tokens, threads, 0, stream>>>(
      pool, step, layer, qkv, qkv_stride, static_cast<int32_t>(k_offset),
      static_cast<int32_t>(v_offset), inv_freq);
  return cudaGetLastError();
}

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
