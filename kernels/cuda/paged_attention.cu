#include "kernels/cuda/paged_attention.cuh"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/attention_stream.cuh"

namespace heavykv::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGroup = kAttentionMaxGroup;
constexpr int kVec = 8;              // bf16 per 16-byte load
constexpr int32_t kMinChunk = 128;   // keys: shorter splits cost more in the combine than they win
constexpr int64_t kSmemBudget = 48 * 1024;
constexpr int64_t kMmaMaxScoreChunk = 1024;

// Lanes that share one K/V row: each loads 8 consecutive elements (a power of two, <= 32).
__host__ __device__ inline int32_t LanesPerKey(int32_t head_dim) {
  int32_t l = 1;
  while (l < head_dim / kVec) l <<= 1;
  return l;
}

// Shared memory: q [G][hd] | o [G][hd] | red [kWarps][kMaxGroup] | stat [2][kMaxGroup] |
// logits [G][chunk], all fp32.
__host__ __device__ inline int64_t FixedSmemFloats(int32_t group, int32_t head_dim) {
  return 2 * int64_t(group) * head_dim + kWarps * kMaxGroup + 2 * kMaxGroup;
}

__device__ inline void Bf16x8ToFloat(const uint4& u, float* f) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = __bfloat1622float2(p[i]);
    f[2 * i] = x.x;
    f[2 * i + 1] = x.y;
  }
}

// Block-wide max (kMax) or sum of v[g], g < group; the result lands in result[0..group) for all.
template <bool kMax, int kG>
__device__ void BlockReduce(float (&v)[kG], int32_t group, float* red, float* result) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    if (g >= group) continue;
    for (int o = 16; o > 0; o >>= 1) {
      const float x = __shfl_xor_sync(0xffffffffu, v[g], o);
      v[g] = kMax ? fmaxf(v[g], x) : v[g] + x;
    }
    if (lane == 0) red[warp * kMaxGroup + g] = v[g];
  }
  __syncthreads();
  if (threadIdx.x < group) {
    float r = red[threadIdx.x];
    for (int w = 1; w < kWarps; ++w) {
      const float x = red[w * kMaxGroup + threadIdx.x];
      r = kMax ? fmaxf(r, x) : r + x;
    }
    result[threadIdx.x] = r;
  }
  __syncthreads();
}

// One (token t, kv head h, split): softmax over the chunk [split * chunk, +len) of t's context.
// kG >= group bounds the per-thread register arrays (1, 2, 4 or 8 instantiations).
template <int kG>
static __global__ void __launch_bounds__(kThreads)
    AttentionSplitKernel(AttentionArgs a, int32_t chunk, int32_t max_splits) {
  extern __shared__ float smem[];
  const int32_t t = blockIdx.x, h = blockIdx.y, split = blockIdx.z;
  const int32_t seq = a.step.token_seq[t];
  const int32_t n = a.step.num_old[seq] + (t - a.step.token_begin[seq]) + 1;
  const int32_t begin = split * chunk;
  if (begin >= n) return;
  const int32_t len = min(chunk, n - begin);
  const int32_t nsplit = (n + chunk - 1) / chunk;
  const int32_t G = a.group, hd = a.pool.head_dim, bs = a.pool.block_size;
  float* q_s = smem;
  float* o_s = q_s + G * hd;
  float* red = o_s + G * hd;
  float* stat = red + kWarps * kMaxGroup;  // [0, kMaxGroup): max, [kMaxGroup, 2k): sum
  float* lg = stat + 2 * kMaxGroup;        // [G][chunk]

  const float* q = a.q + int64_t(t) * a.q_stride + int64_t(h) * G * hd;
  for (int i = threadIdx.x; i < G * hd; i += kThreads) {
    q_s[i] = q[i];
    o_s[i] = 0.0f;
  }
  __syncthreads();

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int32_t lpk = LanesPerKey(hd), kpw = 32 / lpk;
  const int32_t sub = lane % lpk, kl = lane / lpk;
  const bool has_d = sub * kVec < hd;
  const int32_t* pages = a.step.page_ids + a.step.page_indptr[seq];
  const float scale = 1.0f / sqrtf(static_cast<float>(hd));
  const int32_t passes = (len + kpw - 1) / kpw;

  // Logits: the lanes of a key group each hold 8 elements of q (every group head) and of k.
  {
    float qr[kG][kVec];
#pragma unroll
    for (int g = 0; g < kG; ++g) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        qr[g][e] = (g < G && has_d) ? q_s[g * hd + sub * kVec + e] : 0.0f;
      }
    }
    for (int32_t p = warp; p < passes; p += kWarps) {
      const int32_t j = p * kpw + kl;
      uint4 raw = make_uint4(0, 0, 0, 0);
      if (j < len && has_d) {
        const int32_t s = begin + j;
        raw = *reinterpret_cast<const uint4*>(
            a.pool.kv + a.pool.RowOffset(pages[s / bs], a.layer, h, 0, s % bs) + sub * kVec);
      }
      float kf[kVec];
      Bf16x8ToFloat(raw, kf);
      float dot[kG];
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        dot[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < kVec; ++e) dot[g] += qr[g][e] * kf[e];
      }
      for (int o = lpk / 2; o > 0; o >>= 1) {
#pragma unroll
        for (int g = 0; g < kG; ++g) dot[g] += __shfl_xor_sync(0xffffffffu, dot[g], o);
      }
      if (sub == 0 && j < len) {
#pragma unroll
        for (int g = 0; g < kG; ++g) {
          if (g < G) lg[g * chunk + j] = dot[g] * scale;
        }
      }
    }
  }
  __syncthreads();

  // Softmax within the chunk: lg becomes exp(logit - m), m and l the chunk's max and sum.
  float v[kG];
#pragma unroll
  for (int g = 0; g < kG; ++g) v[g] = -INFINITY;
  for (int32_t j = threadIdx.x; j < len; j += kThreads) {
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      if (g < G) v[g] = fmaxf(v[g], lg[g * chunk + j]);
    }
  }
  BlockReduce<true, kG>(v, G, red, stat);
#pragma unroll
  for (int g = 0; g < kG; ++g) v[g] = 0.0f;
  for (int32_t j = threadIdx.x; j < len; j += kThreads) {
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      if (g < G) {
        const float e = expf(lg[g * chunk + j] - stat[g]);
        lg[g * chunk + j] = e;
        v[g] += e;
      }
    }
  }
  BlockReduce<false, kG>(v, G, red, stat + kMaxGroup);

  // P.V with the same lane mapping, over V rows.
  {
    float acc[kG][kVec];
#pragma unroll
    for (int g = 0; g < kG; ++g) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[g][e] = 0.0f;
    }
    for (int32_t p = warp; p < passes; p += kWarps) {
      const int32_t j = p * kpw + kl;
      if (j < len && has_d) {
        const int32_t s = begin + j;
        const uint4 raw = *reinterpret_cast<const uint4*>(
            a.pool.kv + a.pool.RowOffset(pages[s / bs], a.layer, h, 1, s % bs) + sub * kVec);
        float vf[kVec];
        Bf16x8ToFloat(raw, vf);
#pragma unroll
        for (int g = 0; g < kG; ++g) {
          if (g < G) {
            const float pe = lg[g * chunk + j];
#pragma unroll
            for (int e = 0; e < kVec; ++e) acc[g][e] += pe * vf[e];
          }
        }
      }
    }
    for (int o = lpk; o < 32; o <<= 1) {
#pragma unroll
      for (int g = 0; g < kG; ++g) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[g][e] += __shfl_xor_sync(0xffffffffu, acc[g][e], o);
      }
    }
    if (kl == 0 && has_d) {
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        if (g < G) {
#pragma unroll
          for (int e = 0; e < kVec; ++e) atomicAdd(&o_s[g * hd + sub * kVec + e], acc[g][e]);
        }
      }
    }
  }
  __syncthreads();

  const float* m = stat;
  const float* l = stat + kMaxGroup;
  const bool scores = a.step.accumulate[seq] != 0;
  const int64_t item = int64_t(t) * a.pool.num_kv_heads + h;
  if (nsplit == 1) {
    bf16* out = a.out + int64_t(t) * a.out_stride + int64_t(h) * G * hd;
    for (int i = threadIdx.x; i < G * hd; i += kThreads) {
      out[i] = __float2bfloat16_rn(o_s[i] / l[i / hd]);
    }
    if (scores) {  // begin == 0: slot j of the context
      for (int32_t j = threadIdx.x; j < len; j += kThreads) {
        float received = 0.0f;
        for (int g = 0; g < G; ++g) received += lg[g * chunk + j] / l[g];
        atomicAdd(&a.pool.score[a.pool.MetaOffset(pages[j / bs], a.layer, h, j % bs)], received);
      }
    }
    return;
  }
  const int64_t part = item * max_splits + split;
  float* po = a.part_out + part * G * hd;
  for (int i = threadIdx.x; i < G * hd; i += kThreads) po[i] = o_s[i];
  if (threadIdx.x < G) {
    a.part_ml[(part * G + threadIdx.x) * 2] = m[threadIdx.x];
    a.part_ml[(part * G + threadIdx.x) * 2 + 1] = l[threadIdx.x];
  }
  if (scores) {
    float* pe = a.part_e + part * G * chunk;
    for (int32_t j = threadIdx.x; j < len; j += kThreads) {
      for (int g = 0; g < G; ++g) pe[g * chunk + j] = lg[g * chunk + j];
    }
  }
}

// One (token, kv head) whose context took several splits: rescales each split by
// exp(m_c - M) / L into the output and the scores.
static __global__ void __launch_bounds__(kThreads)
    AttentionCombineKernel(AttentionArgs a, int32_t chunk, int32_t max_splits) {
  extern __shared__ float factor[];  // [max_splits][G]
  const int32_t t = blockIdx.x, h = blockIdx.y;
  const int32_t seq = a.step.token_seq[t];
  const int32_t n = a.step.num_old[seq] + (t - a.step.token_begin[seq]) + 1;
  const int32_t nsplit = (n + chunk - 1) / chunk;
  if (nsplit <= 1) return;
  const int32_t G = a.group, hd = a.pool.head_dim, bs = a.pool.block_size;
  const int64_t item = int64_t(t) * a.pool.num_kv_heads + h;
  const float* ml = a.part_ml + item * max_splits * G * 2;
  if (threadIdx.x < G) {
    const int g = threadIdx.x;
    float M = -INFINITY;
    for (int c = 0; c < nsplit; ++c) M = fmaxf(M, ml[(c * G + g) * 2]);
    float L = 0.0f;
    for (int c = 0; c < nsplit; ++c) L += ml[(c * G + g) * 2 + 1] * expf(ml[(c * G + g) * 2] - M);
    for (int c = 0; c < nsplit; ++c) factor[c * G + g] = expf(ml[(c * G + g) * 2] - M) / L;
  }
  __syncthreads();
  const float* po = a.part_out + item * max_splits * G * hd;
  bf16* out = a.out + int64_t(t) * a.out_stride + int64_t(h) * G * hd;
  for (int i = threadIdx.x; i < G * hd; i += kThreads) {
    const int g = i / hd;
    float sum = 0.0f;
    for (int c = 0; c < nsplit; ++c) sum += po[int64_t(c) * G * hd + i] * factor[c * G + g];
    out[i] = __float2bfloat16_rn(sum);
  }
  if (a.step.accumulate[seq] == 0) return;
  const int32_t* pages = a.step.page_ids + a.step.page_indptr[seq];
  const float* pe = a.part_e + item * max_splits * G * chunk;
  for (int32_t s = threadIdx.x; s < n; s += kThreads) {
    const int32_t c = s / chunk, j = s % chunk;
    float received = 0.0f;
    for (int g = 0; g < G; ++g) received += pe[(int64_t(c) * G + g) * chunk + j] * factor[c * G + g];
    atomicAdd(&a.pool.score[a.pool.MetaOffset(pages[s / bs], a.layer, h, s % bs)], received);
  }
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

AttentionKernel DefaultAttentionKernel() {
  static const AttentionKernel kernel = [] {
    const char* v = std::getenv("HEAVYKV_CUDA_ATTENTION");
    if (v != nullptr && std::strcmp(v, "two-pass") == 0) return AttentionKernel::kTwoPass;
    if (v != nullptr && std::strcmp(v, "stream") == 0) return AttentionKernel::kStream;
    return AttentionKernel::kMma;
  }();
  return kernel;
}

const char* AttentionKernelName(AttentionKernel kernel) {
  return kernel == AttentionKernel::kTwoPass ? "two-pass"
         : kernel == AttentionKernel::kStream ? "stream"
                                              : "mma";
}

namespace {

void SizeScratch(int64_t items, int32_t group, int32_t head_dim, bool scores,
                 AttentionPlan* plan) {
  if (plan->max_splits > 1) {
    const int64_t parts = items * plan->max_splits * group;
    plan->part_out_floats = parts * head_dim;
    plan->part_ml_floats = parts * 2;
    plan->part_e_floats = scores ? parts * plan->chunk : 0;
  }
}

// kStream and kMma: without scores a chunk needs no shared memory per key, so a context splits
// only to fill the GPU: of the split counts from the fewest the shared memory allows to chunks of
// kMinChunk keys, the one whose blocks fill the resident slots in whole waves best.
AttentionPlan PlanStream(int32_t num_tokens, int32_t num_kv_heads, int32_t group,
                         int32_t head_dim, int32_t max_keys, bool scores, int32_t num_sms,
                         int32_t max_chunk, AttentionKernel kernel) {
  const bool mma = kernel == AttentionKernel::kMma;
  auto smem_bytes = [&](int32_t logit_keys) {
    return mma ? internal::MmaSmemBytes(group, head_dim, logit_keys)
               : internal::StreamSmemBytes(group, head_dim, logit_keys);
  };
  AttentionPlan plan;
  plan.kernel = kernel;
  plan.scores = scores;
  const int64_t fixed = smem_bytes(0), budget = mma ? internal::kMmaSmemBudget : kSmemBudget;
  int64_t limit = int64_t(1) << 30;
  if (scores) limit = std::max<int64_t>(32, (budget - fixed) / (4 * group) / 32 * 32);
  // kMma with scores: chunks of at most 1024 keys. Longer ones fit its shared memory but cost
  // residency and serialise each block's score epilogue (run 5, b64 x ctx4096 hd128: 4096-key
  // chunks 329 us, 1024 306 us, 512 320 us).
  if (scores && mma) limit = std::min<int64_t>(limit, kMmaMaxScoreChunk);
  if (max_chunk > 0) limit = std::min<int64_t>(limit, max_chunk);
  const int64_t keys = std::max(1, max_keys);
  const int64_t items = std::max<int64_t>(1, int64_t(num_tokens) * num_kv_heads);
  const int64_t fewest = CeilDiv(keys, limit);
  const int64_t most = std::min(fewest + 256, std::max(fewest, CeilDiv(keys, kMinChunk)));
  double best_fill = -1.0;
  for (int64_t s = fewest; s <= most; ++s) {
    const int64_t chunk = std::min(limit, CeilDiv(CeilDiv(keys, s), 32) * 32);
    const int64_t splits = CeilDiv(keys, chunk);
    const int64_t smem = smem_bytes(scores ? int32_t(chunk) : 0);
    int64_t per_sm = mma ? internal::MmaBlocksPerSm(head_dim, smem)
                         : internal::StreamBlocksPerSm(group, smem);
    if (per_sm <= 0) per_sm = 4;  // no device to ask (the plan is still valid)
    const int64_t slots = per_sm * std::max(1, num_sms), blocks = items * splits;
    const double fill = double(blocks) / double(CeilDiv(blocks, slots) * slots);
    if (fill > best_fill + 0.02) {
      best_fill = fill;
      plan.chunk = static_cast<int32_t>(chunk);
      plan.max_splits = static_cast<int32_t>(splits);
    }
  }
  SizeScratch(items, group, head_dim, scores, &plan);
  return plan;
}

}  // namespace

AttentionPlan PlanAttention(int32_t num_tokens, int32_t num_kv_heads, int32_t group,
                            int32_t head_dim, int32_t max_keys, bool scores, int32_t num_sms,
                            int32_t max_chunk, AttentionKernel kernel) {
  if (kernel == AttentionKernel::kMma && !internal::MmaSupports(head_dim)) {
    kernel = AttentionKernel::kStream;
  }
  if (kernel != AttentionKernel::kTwoPass) {
    return PlanStream(num_tokens, num_kv_heads, group, head_dim, max_keys, scores, num_sms,
                      max_chunk, kernel);
  }
  AttentionPlan plan;
  plan.kernel = AttentionKernel::kTwoPass;
  plan.scores = scores;
  const int64_t fixed = FixedSmemFloats(group, head_dim) * int64_t(sizeof(float));
  int64_t limit = (kSmemBudget - fixed) / (int64_t(sizeof(float)) * std::max(1, group));
  limit = std::max<int64_t>(32, limit / 32 * 32);
  if (max_chunk > 0) limit = std::min<int64_t>(limit, max_chunk);
  const int64_t keys = std::max(1, max_keys);
  const int64_t items = std::max<int64_t>(1, int64_t(num_tokens) * num_kv_heads);
  int64_t splits = CeilDiv(keys, limit);
  // Few (token, head) items: split further, down to kMinChunk keys, for ~2 blocks per SM.
  const int64_t want = CeilDiv(2 * int64_t(std::max(1, num_sms)), items);
  splits = std::max(splits, std::min(want, CeilDiv(keys, kMinChunk)));
  int64_t chunk = std::min(limit, CeilDiv(CeilDiv(keys, splits), 32) * 32);
  plan.chunk = static_cast<int32_t>(chunk);
  plan.max_splits = static_cast<int32_t>(CeilDiv(keys, chunk));
  SizeScratch(items, group, head_dim, scores, &plan);
  return plan;
}

cudaError_t PagedAttention(const AttentionArgs& args, const AttentionPlan& plan,
                           cudaStream_t stream) {
  const int32_t hd = args.pool.head_dim, G = args.group;
  if (G < 1 || G > kAttentionMaxGroup || hd < kVec || hd > kAttentionMaxHeadDim || hd % kVec ||
      plan.chunk < 1 || plan.max_splits < 1 || plan.max_splits > 65535) {
    return cudaErrorInvalidValue;
  }
  if (args.step.num_tokens <= 0) return cudaSuccess;
  const dim3 cgrid(args.step.num_tokens, args.pool.num_kv_heads);
  if (plan.kernel != AttentionKernel::kTwoPass) {
    const cudaError_t e = plan.kernel == AttentionKernel::kMma
                              ? internal::LaunchAttentionMma(args, plan, stream)
                              : internal::LaunchAttentionStream(args, plan, stream);
    if (e != cudaSuccess || plan.max_splits == 1) return e;
    AttentionCombineKernel<<<cgrid, kThreads, plan.max_splits * G * sizeof(float), stream>>>(
        args, plan.chunk, plan.max_splits);
    return cudaGetLastError();
  }
  const size_t smem = (FixedSmemFloats(G, hd) + int64_t(G) * plan.chunk) * sizeof(float);
  if (smem > size_t(kSmemBudget)) return cudaErrorInvalidValue;
  const dim3 grid(args.step.num_tokens, args.pool.num_kv_heads, plan.max_splits);
  if (G <= 1) {
    AttentionSplitKernel<1><<<grid, kThreads, smem, stream>>>(args, plan.chunk, plan.max_splits);
  } else if (G <= 2) {
    AttentionSplitKernel<2><<<grid, kThreads, smem, stream>>>(args, plan.chunk, plan.max_splits);
  } else if (G <= 4) {
    AttentionSplitKernel<4><<<grid, kThreads, smem, stream>>>(args, plan.chunk, plan.max_splits);
  } else {
    AttentionSplitKernel<8><<<grid, kThreads, smem, stream>>>(args, plan.chunk, plan.max_splits);
  }
  if (plan.max_splits > 1) {
    AttentionCombineKernel<<<cgrid, kThreads, plan.max_splits * G * sizeof(float), stream>>>(
        args, plan.chunk, plan.max_splits);
  }
  return cudaGetLastError();
}

}  // namespace heavykv::cuda
