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

// One thread per pair of entries, blockIdx.y tiles a token row: the pairs of q and k are
// rotated in place (as RopeKernel, from the same table; with kNeox pair i of a head is entries
// (i mod head_dim) / 2 and that + head_dim / 2 of it), each rotated k pair and each V pair is
// also stored to its page as bf16. One pair per thread keeps the launch to a few dependent loads
// (the first version looped over the row in one block per token: 7 us a launch).
template <bool kNeox>
static __global__ void RopeKvAppendKernel(DeviceKvPool pool, DeviceStep step, int32_t layer,
                                          float* __restrict__ qkv, int64_t qkv_stride,
                                          int32_t k_offset, int32_t v_offset,
                                          const float* __restrict__ inv_freq) {
  const int32_t t = blockIdx.x, hd = pool.head_dim;
  const int32_t kv_dim = pool.num_kv_heads * hd, rot = k_offset + kv_dim;
  const int32_t i = 2 * int32_t(blockIdx.y * blockDim.x + threadIdx.x);  // in [0, rot + kv_dim)
  if (blockIdx.y == 0 && threadIdx.x < pool.num_kv_heads) {
    const int32_t seq = step.token_seq[t], bs = pool.block_size;
    const int32_t slot = step.num_old[seq] + (t - step.token_begin[seq]);
    const int64_t m = pool.MetaOffset(step.page_ids[step.page_indptr[seq] + slot / bs], layer,
                                      threadIdx.x, slot % bs);
    pool.pos[m] = step.token_pos[t];
    pool.score[m] = 0.0f;
  }
  if (i >= rot + kv_dim) return;
  // Every load first (the row, the angle, the page chain), so that their latencies overlap.
  // The pair's two entries: e0 and e0 + de of the row (de 1, or head_dim / 2 for a NEOX q/k pair).
  const bool rotates = i < rot;
  const int32_t e0 = !rotates ? v_offset + (i - rot)
                              : (kNeox ? (i - i % hd) + (i % hd) / 2 : i);
  const int32_t de = kNeox && rotates ? hd / 2 : 1;
  float* x = qkv + int64_t(t) * qkv_stride + e0;
  float2 r;
  if (kNeox && rotates) {
    r = make_float2(x[0], x[de]);
  } else {
    r = *reinterpret_cast<const float2*>(x);
  }
  const float val = rotates ? float(step.token_pos[t]) * __ldg(inv_freq + (i % hd) / 2) : 0.0f;
  int32_t page = 0, slot = 0;
  const int32_t bs = pool.block_size;
  if (i >= k_offset) {
    const int32_t seq = step.token_seq[t];
    slot = step.num_old[seq] + (t - step.token_begin[seq]);
    page = step.page_ids[step.page_indptr[seq] + slot / bs];
  }
  if (rotates) {
    const float c = cosf(val), s = sinf(val);
    r = make_float2(r.x * c - r.y * s, r.x * s + r.y * c);
    if (kNeox) {
      x[0] = r.x;
      x[de] = r.y;
    } else {
      *reinterpret_cast<float2*>(x) = r;
    }
  }
  if (i < k_offset) return;
  // The pair's first entry within the kv heads' K (or V) rows.
  const int32_t e = rotates ? e0 - k_offset : i - rot;
  bf16* d = pool.kv + pool.RowOffset(page, layer, e / hd, rotates ? 0 : 1, slot % bs) + e % hd;
  if (kNeox && rotates) {
    d[0] = __float2bfloat16_rn(r.x);
    d[de] = __float2bfloat16_rn(r.y);
  } else {
    *reinterpret_cast<__nv_bfloat162*>(d) = __floats2bfloat162_rn(r.x, r.y);
  }
}

}  // namespace

cudaError_t RopeKvAppend(const DeviceKvPool& pool, const DeviceStep& step, int32_t layer,
                         float* qkv, int64_t qkv_stride, int64_t k_offset, int64_t v_offset,
                         const float* inv_freq, bool neox, cudaStream_t stream) {
  if (step.num_tokens <= 0) return cudaSuccess;
  if (k_offset % pool.head_dim != 0 || k_offset % 2 || v_offset % 2 || qkv_stride % 2) {
    return cudaErrorInvalidValue;
  }
  const int64_t pairs = (k_offset + 2 * int64_t(pool.num_kv_heads) * pool.head_dim) / 2;
  const int threads = pairs >= 256 ? 256 : 64;
  const dim3 grid(step.num_tokens, static_cast<unsigned>((pairs + threads - 1) / threads));
  const auto kernel = neox ? RopeKvAppendKernel<true> : RopeKvAppendKernel<false>;
  kernel<<<grid, threads, 0, stream>>>(pool, step, layer, qkv, qkv_stride,
                                       static_cast<int32_t>(k_offset),
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
