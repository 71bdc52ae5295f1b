#include "kernels/cuda/evict.cuh"

#include "kernels/cuda/eviction_rule.h"

namespace heavykv::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

struct HeadCtx {
  const int32_t* pages;
  int32_t layer, head, kind, param, newest;
};

__device__ inline uint64_t KeyOf(const DeviceKvPool& pool, const HeadCtx& c, int32_t s) {
  const int64_t m =
      pool.MetaOffset(c.pages[s / pool.block_size], c.layer, c.head, s % pool.block_size);
  return EvictionKey(c.kind, c.param, c.newest, pool.pos[m], pool.score[m]);
}

// Shared memory: victim flags [max_held] bytes, then holes and movers [max_held] int32 each.
static __global__ void __launch_bounds__(kThreads)
    EvictKernel(DeviceKvPool pool, DeviceStep step, int32_t layer, int32_t max_held,
                int32_t* error) {
  extern __shared__ int32_t smem_i[];
  __shared__ uint64_t red_key[kWarps];
  __shared__ unsigned int hist[256];
  __shared__ uint64_t sel_prefix;
  __shared__ int32_t sel_rank;
  __shared__ int32_t num_pairs;

  const int32_t seq = blockIdx.x, h = blockIdx.y;
  const int32_t kind = step.evict_kind[seq];
  const int32_t held = step.num_old[seq] + step.num_new[seq];
  const int32_t budget = step.budget[seq];
  if (kind == kEvictNone || held <= budget) return;
  const int32_t num_evict = held - budget;
  HeadCtx c{step.page_ids + step.page_indptr[seq], layer, h, kind, step.evict_param[seq],
            step.start_pos[seq] + step.num_new[seq] - 1};
  int32_t* holes = smem_i;
  int32_t* movers = holes + max_held;
  unsigned char* victim = reinterpret_cast<unsigned char*>(movers + max_held);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  // The threshold: the num_evict-th smallest key (keys are distinct).
  uint64_t threshold;
  if (num_evict == 1) {
    uint64_t best = kNotCandidate;
    for (int32_t s = threadIdx.x; s < held; s += kThreads) {
      const uint64_t k = KeyOf(pool, c, s);
      best = k < best ? k : best;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const uint64_t x = __shfl_xor_sync(0xffffffffu, best, o);
      best = x < best ? x : best;
    }
    if (lane == 0) red_key[warp] = best;
    __syncthreads();
    threshold = red_key[0];
    for (int w = 1; w < kWarps; ++w) threshold = red_key[w] < threshold ? red_key[w] : threshold;
  } else {
    // MSB-first radix select, 8 bits a pass, over the keys that match the prefix so far.
    if (threadIdx.x == 0) {
      sel_prefix = 0;
      sel_rank = num_evict;  // 1-based rank still to find among the matching keys
    }
    uint64_t mask = 0;
    for (int shift = 56; shift >= 0; shift -= 8) {
      hist[threadIdx.x] = 0;
      __syncthreads();
      const uint64_t prefix = sel_prefix;
      for (int32_t s = threadIdx.x; s < held; s += kThreads) {
        const uint64_t k = KeyOf(pool, c, s);
        if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255], 1u);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        int32_t rank = sel_rank;
        int b = 0;
        for (; b < 255 && int32_t(hist[b]) < rank; ++b) rank -= hist[b];
        sel_rank = rank;
        sel_prefix = prefix | (uint64_t(b) << shift);
      }
      mask |= uint64_t(255) << shift;
      __syncthreads();
    }
    threshold = sel_prefix;
  }
  __syncthreads();
  if (threshold == kNotCandidate) {  // fewer candidates than victims needed
    if (threadIdx.x == 0) atomicExch(error, 1);
    return;
  }

  for (int32_t s = threadIdx.x; s < held; s += kThreads) {
    victim[s] = KeyOf(pool, c, s) <= threshold ? 1 : 0;
  }
  __syncthreads();
  // Holes (victims below the budget) and movers (survivors at or past it), each in slot order,
  // by one warp with ballots.
  if (warp == 0) {
    int32_t nh = 0, nm = 0;
    for (int32_t base = 0; base < held; base += 32) {
      const int32_t s = base + lane;
      const bool in = s < held;
      const bool is_hole = in && s < budget && victim[s];
      const bool is_mover = in && s >= budget && !victim[s];
      const unsigned hb = __ballot_sync(0xffffffffu, is_hole);
      const unsigned mb = __ballot_sync(0xffffffffu, is_mover);
      const unsigned below = (1u << lane) - 1;
      if (is_hole) holes[nh + __popc(hb & below)] = s;
      if (is_mover) movers[nm + __popc(mb & below)] = s;
      nh += __popc(hb);
      nm += __popc(mb);
    }
    if (lane == 0) num_pairs = nh < nm ? nh : nm;  // equal unless the victim count was off
  }
  __syncthreads();
  const int32_t hd = pool.head_dim, bs = pool.block_size;
  const int32_t pairs = num_pairs;
  for (int64_t i = threadIdx.x; i < int64_t(pairs) * hd; i += kThreads) {
    const int32_t r = static_cast<int32_t>(i / hd), d = static_cast<int32_t>(i % hd);
    const int32_t dst = holes[r], src = movers[r];
    const int32_t pd = c.pages[dst / bs], ps = c.pages[src / bs];
    pool.kv[pool.RowOffset(pd, layer, h, 0, dst % bs) + d] =
        pool.kv[pool.RowOffset(ps, layer, h, 0, src % bs) + d];
    pool.kv[pool.RowOffset(pd, layer, h, 1, dst % bs) + d] =
        pool.kv[pool.RowOffset(ps, layer, h, 1, src % bs) + d];
  }
  for (int32_t r = threadIdx.x; r < pairs; r += kThreads) {
    const int32_t dst = holes[r], src = movers[r];
    const int64_t md = pool.MetaOffset(c.pages[dst / bs], layer, h, dst % bs);
    const int64_t ms = pool.MetaOffset(c.pages[src / bs], layer, h, src % bs);
    pool.pos[md] = pool.pos[ms];
    pool.score[md] = pool.score[ms];
  }
}

}  // namespace

cudaError_t EvictLayer(const DeviceKvPool& pool, const DeviceStep& step, int32_t layer,
                       int32_t max_held, int32_t* error, cudaStream_t stream) {
  if (step.num_seqs <= 0 || max_held <= 0) return cudaSuccess;
  const size_t smem = size_t(max_held) * (2 * sizeof(int32_t) + 1);
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(EvictKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  EvictKernel<<<dim3(step.num_seqs, pool.num_kv_heads), kThreads, smem, stream>>>(
      pool, step, layer, max_held, error);
  return cudaGetLastError();
}

}  // namespace heavykv::cuda
