#include "kernels/cuda/attention_stream.cuh"

#include <algorithm>
#include <array>

namespace heavykv::cuda::internal {
namespace {

constexpr int kWarps = kStreamWarps;
constexpr int kThreads = kStreamThreads;
constexpr int kVec = 8;     // bf16 per 16-byte load
constexpr int kUnroll = 4;     // keys per lane group per iteration: 4 K + 4 V loads in flight
constexpr int kMinBlocks = 4;  // per SM: at most 128 registers (2 for a group of 8)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// Below every real logit (in log2 units) and finite, so exp2(kNoLogit - kNoLogit) is no NaN.
constexpr float kNoLogit = -1e30f;

// Lanes that share one K/V row: each loads 8 consecutive elements (a power of two, <= 32).
__device__ inline int32_t LanesPerKey(int32_t head_dim) {
  int32_t l = 1;
  while (l < head_dim / kVec) l <<= 1;
  return l;
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

// One (token t, kv head h, split): attention over the keys [split * chunk, +len) of t's context,
// in log2 units internally (q is prescaled by log2(e) / sqrt(hd)); what leaves the kernel (the
// split's max in part_ml, exp(logit - max) in part_e) is in natural units, as the combine
// kernel expects. `logit_keys` is the stride of the shared logits ([G][logit_keys]; 0: none).
template <int kG>
static __global__ void __launch_bounds__(kThreads, kG >= 8 ? 2 : kMinBlocks)
    AttentionStreamKernel(AttentionArgs a, int32_t chunk, int32_t max_splits,
                          int32_t logit_keys) {
  extern __shared__ float smem[];
  const int32_t t = blockIdx.x, h = blockIdx.y, split = blockIdx.z;
  const int32_t seq = a.step.token_seq[t];
  const int32_t n = a.step.num_old[seq] + (t - a.step.token_begin[seq]) + 1;
  const int32_t begin = split * chunk;
  if (begin >= n) return;
  const int32_t len = min(chunk, n - begin);
  const int32_t nsplit = (n + chunk - 1) / chunk;
  const int32_t G = a.group, hd = a.pool.head_dim, bs = a.pool.block_size;
  const bool scores = logit_keys > 0 && a.step.accumulate[seq] != 0;
  float* wacc = smem;                      // [kWarps][G][hd]
  float* q_s = wacc + kWarps * G * hd;     // [G][hd], 16-byte aligned (hd % 8 == 0)
  float* wml = q_s + G * hd;               // [kWarps][G][2]
  float* stat = wml + kWarps * G * 2;      // [G] max, then [G] sum
  float* lg = stat + 2 * G;                // [G][logit_keys]

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int32_t lpk = LanesPerKey(hd), kpw = 32 / lpk;
  const int32_t sub = lane % lpk, kl = lane / lpk;
  const bool has_d = sub * kVec < hd;
  const int32_t* pages = a.step.page_ids + a.step.page_indptr[seq];
  const int64_t v_offset = int64_t(bs) * hd;  // V row r follows K row r by one block of rows

  {  // q of the group, prescaled, into shared memory: registers are what limits residency
    const float scale = kLog2e / sqrtf(static_cast<float>(hd));
    const float* q = a.q + int64_t(t) * a.q_stride + int64_t(h) * G * hd;
    for (int i = threadIdx.x; i < G * hd; i += kThreads) q_s[i] = q[i] * scale;
  }
  __syncthreads();
  const float* q_lane = q_s + (has_d ? sub * kVec : 0);

  float m[kG], l[kG], acc[kG][kVec];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    m[g] = kNoLogit;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[g][e] = 0.0f;
  }

  // Warp w takes the tiles w, w + kWarps, ... of kUnroll * kpw keys; lane group kl the keys
  // base + u * kpw + kl, so each load instruction reads kpw consecutive rows.
  const int32_t tile = kUnroll * kpw;
  for (int32_t base = warp * tile; base < len; base += kWarps * tile) {
    uint4 kraw[kUnroll], vraw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t j = base + u * kpw + kl;
      kraw[u] = vraw[u] = make_uint4(0, 0, 0, 0);
      if (j < len && has_d) {
        const int32_t s = begin + j;
        const int32_t page = __ldg(pages + s / bs);
        const bf16* row = a.pool.kv + a.pool.RowOffset(page, a.layer, h, 0, s % bs) + sub * kVec;
        kraw[u] = __ldg(reinterpret_cast<const uint4*>(row));
        vraw[u] = __ldg(reinterpret_cast<const uint4*>(row + v_offset));
      }
    }
    float p[kUnroll][kG];
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      float qg[kVec];
      if (g < G) {
        const float4 lo = *reinterpret_cast<const float4*>(q_lane + g * hd);
        const float4 hi = *reinterpret_cast<const float4*>(q_lane + g * hd + 4);
        qg[0] = lo.x, qg[1] = lo.y, qg[2] = lo.z, qg[3] = lo.w;
        qg[4] = hi.x, qg[5] = hi.y, qg[6] = hi.z, qg[7] = hi.w;
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) qg[e] = 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const __nv_bfloat162* k2 = reinterpret_cast<const __nv_bfloat162*>(&kraw[u]);
        float d = 0.0f;
#pragma unroll
        for (int i = 0; i < kVec / 2; ++i) {
          const float2 kf = __bfloat1622float2(k2[i]);
          d += qg[2 * i] * kf.x + qg[2 * i + 1] * kf.y;
        }
        p[u][g] = d;
      }
    }
    for (int o = lpk / 2; o > 0; o >>= 1) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int g = 0; g < kG; ++g) p[u][g] += __shfl_xor_sync(0xffffffffu, p[u][g], o);
      }
    }
    bool valid[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t j = base + u * kpw + kl;
      valid[u] = j < len;
      if (scores && valid[u] && sub == 0) {
#pragma unroll
        for (int g = 0; g < kG; ++g) {
          if (g < G) lg[g * logit_keys + j] = p[u][g];
        }
      }
    }
    // Online softmax: rescale the running sums once per tile, then add the tile's keys.
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      float mt = m[g];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) mt = valid[u] ? fmaxf(mt, p[u][g]) : mt;
      const float corr = exp2f(m[g] - mt);
      m[g] = mt;
      l[g] *= corr;
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[g][e] *= corr;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        p[u][g] = valid[u] ? exp2f(p[u][g] - mt) : 0.0f;
        l[g] += p[u][g];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float vf[kVec];
      Bf16x8ToFloat(vraw[u], vf);
#pragma unroll
      for (int g = 0; g < kG; ++g) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[g][e] += p[u][g] * vf[e];
      }
    }
  }

  // The lane groups of a warp merge (every lane of a group holds the same m and l).
  for (int o = lpk; o < 32; o <<= 1) {
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      const float mo = __shfl_xor_sync(0xffffffffu, m[g], o);
      const float lo = __shfl_xor_sync(0xffffffffu, l[g], o);
      const float mn = fmaxf(m[g], mo);
      const float ca = exp2f(m[g] - mn), cb = exp2f(mo - mn);
      l[g] = l[g] * ca + lo * cb;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        acc[g][e] = acc[g][e] * ca + __shfl_xor_sync(0xffffffffu, acc[g][e], o) * cb;
      }
      m[g] = mn;
    }
  }
  if (kl == 0 && has_d) {
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      if (g < G) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) wacc[(warp * G + g) * hd + sub * kVec + e] = acc[g][e];
      }
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      if (g < G) {
        wml[(warp * G + g) * 2] = m[g];
        wml[(warp * G + g) * 2 + 1] = l[g];
      }
    }
  }
  __syncthreads();
  // The warps merge: the block's max M and sum L per group head, then the outputs.
  if (threadIdx.x < G) {
    const int g = threadIdx.x;
    float M = kNoLogit;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, wml[(w * G + g) * 2]);
    float L = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      L += wml[(w * G + g) * 2 + 1] * exp2f(wml[(w * G + g) * 2] - M);
    }
    stat[g] = M;
    stat[G + g] = L;
  }
  __syncthreads();
  const int64_t item = int64_t(t) * a.pool.num_kv_heads + h;
  const int64_t part = item * max_splits + split;
  for (int i = threadIdx.x; i < G * hd; i += kThreads) {
    const int g = i / hd;
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      o += wacc[w * G * hd + i] * exp2f(wml[(w * G + g) * 2] - stat[g]);
    }
    if (nsplit == 1) {
      a.out[int64_t(t) * a.out_stride + int64_t(h) * G * hd + i] =
          __float2bfloat16_rn(o / stat[G + g]);
    } else {
      a.part_out[part * G * hd + i] = o;
    }
  }
  if (nsplit > 1 && threadIdx.x < G) {
    a.part_ml[(part * G + threadIdx.x) * 2] = stat[threadIdx.x] * kLn2;
    a.part_ml[(part * G + threadIdx.x) * 2 + 1] = stat[G + threadIdx.x];
  }
  if (!scores) return;
  if (nsplit == 1) {  // begin == 0: slot j of the context
    for (int32_t j = threadIdx.x; j < len; j += kThreads) {
      float received = 0.0f;
      for (int g = 0; g < G; ++g) {
        received += exp2f(lg[g * logit_keys + j] - stat[g]) / stat[G + g];
      }
      atomicAdd(&a.pool.score[a.pool.MetaOffset(pages[j / bs], a.layer, h, j % bs)], received);
    }
    return;
  }
  float* pe = a.part_e + part * G * chunk;
  for (int32_t j = threadIdx.x; j < len; j += kThreads) {
    for (int g = 0; g < G; ++g) pe[g * chunk + j] = exp2f(lg[g * logit_keys + j] - stat[g]);
  }
}

// Resident blocks per SM as registers and threads allow (asked once per process); 0 without a
// device.
template <int kG>
int32_t BlocksPerSmBeforeSmem() {
  static const int32_t blocks = [] {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, AttentionStreamKernel<kG>, kThreads, 0) !=
        cudaSuccess) {
      cudaGetLastError();  // clear it
      return 0;
    }
    return b;
  }();
  return blocks;
}

}  // namespace

int32_t StreamBlocksPerSm(int32_t group, int64_t smem_bytes) {
  const int32_t before = group <= 1   ? BlocksPerSmBeforeSmem<1>()
                         : group <= 2 ? BlocksPerSmBeforeSmem<2>()
                         : group <= 4 ? BlocksPerSmBeforeSmem<4>()
                                      : BlocksPerSmBeforeSmem<8>();
  // Shared memory per SM and the part the runtime reserves per block (1 KB on sm_80/sm_90).
  static const std::array<int64_t, 2> per_sm = [] {
    int device = 0, sm = 0, reserved = 0;
    cudaGetDevice(&device);
    if (cudaDeviceGetAttribute(&sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) !=
            cudaSuccess ||
        cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device) !=
            cudaSuccess) {
      cudaGetLastError();
      return std::array<int64_t, 2>{0, 0};
    }
    return std::array<int64_t, 2>{sm, reserved};
  }();
  if (before <= 0 || per_sm[0] <= 0) return 0;
  return static_cast<int32_t>(
      std::min<int64_t>(before, per_sm[0] / std::max<int64_t>(1, smem_bytes + per_sm[1])));
}

cudaError_t LaunchAttentionStream(const AttentionArgs& args, const AttentionPlan& plan,
                                  cudaStream_t stream) {
  const int32_t G = args.group, hd = args.pool.head_dim;
  const int32_t logit_keys = plan.scores ? plan.chunk : 0;
  const size_t smem = static_cast<size_t>(StreamSmemBytes(G, hd, logit_keys));
  if (smem > 48 * 1024) return cudaErrorInvalidValue;
  const dim3 grid(args.step.num_tokens, args.pool.num_kv_heads, plan.max_splits);
  const int32_t c = plan.chunk, s = plan.max_splits;
  if (G <= 1) {
    AttentionStreamKernel<1><<<grid, kThreads, smem, stream>>>(args, c, s, logit_keys);
  } else if (G <= 2) {
    AttentionStreamKernel<2><<<grid, kThreads, smem, stream>>>(args, c, s, logit_keys);
  } else if (G <= 4) {
    AttentionStreamKernel<4><<<grid, kThreads, smem, stream>>>(args, c, s, logit_keys);
  } else {
    AttentionStreamKernel<8><<<grid, kThreads, smem, stream>>>(args, c, s, logit_keys);
  }
  return cudaGetLastError();
}

}  // namespace heavykv::cuda::internal
