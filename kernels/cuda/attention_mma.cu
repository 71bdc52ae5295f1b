#include "kernels/cuda/attention_mma.cuh"

#include <algorithm>
#include <array>

namespace heavykv::cuda::internal {
namespace {

constexpr int kWarps = kMmaWarps;
constexpr int kThreads = kMmaThreads;
constexpr int kTile = 16;  // keys per warp and iteration: the k dimension of one P.V mma
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// Below every real logit (in log2 units) and finite, so exp2(kNoLogit - kNoLogit) is no NaN.
constexpr float kNoLogit = -1e30f;

// d += a * b for one m16n8k16 tile: a 16x16 row-major (4 registers of 2 bf16), b 16x8
// column-major (2 registers), d 16x8 fp32. Lane (r = lane / 4, c = lane % 4) holds a[r][2c, 2c+1]
// (a0), a[r + 8][2c, 2c+1] (a1), a[r][2c + 8, 2c + 9] (a2), a[r + 8][2c + 8, 2c + 9] (a3),
// b[2c, 2c+1][r] (b0), b[2c + 8, 2c + 9][r] (b1), d[r][2c, 2c+1] (d0, d1), d[r + 8][..] (d2, d3).
__device__ __forceinline__ void Mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t Word(const uint4& u, int w) {
  return w == 0 ? u.x : w == 1 ? u.y : w == 2 ? u.z : u.w;
}

// One (token t, kv head h, split) over the keys [split * chunk, +len) of t's context, as the
// stream kernel (same outputs, scratch and shared logits), in tiles of 16 keys per warp.
// Lane (r = lane / 4, c = lane % 4) of a warp:
// - q.K^T (M: the group's heads, padded to 16; N: 8 keys; K: head dims): it loads K rows r and
//   r + 8 of the tile, dims kk * 32 + c * 8 + [0, 8) for each kk; those 8 dims are the lane's
//   k-slots of two k-steps (q's smem copy is read with the same permutation), and its
//   accumulators hold the logits of head r for keys 2c, 2c + 1 (+ 8).
// - O^T = V^T P^T (M: head dims; N: the 8 heads; K: the 16 keys): it loads V rows 2c, 2c + 1,
//   2c + 8, 2c + 9, dims blk * 64 + r * 8 + [0, 8); m-tile i's rows r and r + 8 are the dims
//   D(i, 0) and D(i, 1), D(i, e) = (i / 4) * 64 + r * 8 + (i % 4) * 2 + e, and P^T's operand is
//   exactly the logits' accumulator layout (head r, keys 2c, 2c + 1, 2c + 8, 2c + 9).
template <int kD>
static __global__ void __launch_bounds__(kThreads, 4)
    AttentionMmaKernel(AttentionArgs a, int32_t chunk, int32_t max_splits, int32_t logit_keys) {
  extern __shared__ __align__(16) float smem[];
  const int32_t t = blockIdx.x, h = blockIdx.y, split = blockIdx.z;
  const int32_t seq = a.step.token_seq[t];
  const int32_t n = a.step.num_old[seq] + (t - a.step.token_begin[seq]) + 1;
  const int32_t begin = split * chunk;
  if (begin >= n) return;
  const int32_t len = min(chunk, n - begin);
  const int32_t nsplit = (n + chunk - 1) / chunk;
  const int32_t G = a.group, bs = a.pool.block_size;
  const bool scores = logit_keys > 0 && a.step.accumulate[seq] != 0;
  float* wacc = smem;                                             // [kWarps][G][kD]
  uint4* q_s = reinterpret_cast<uint4*>(wacc + kWarps * G * kD);  // [2][8][kD] bf16: hi, lo
  float* wml = wacc + kWarps * G * kD + 8 * kD;                   // [kWarps][G][2]
  float* stat = wml + kWarps * G * 2;                             // [G] max, then [G] sum
  float* lg = stat + 2 * G;                                       // [G][logit_keys]

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int r = lane / 4, c = lane % 4;
  const int32_t* pages = a.step.page_ids + a.step.page_indptr[seq];
  const int64_t v_offset = int64_t(bs) * kD;  // V row r follows K row r by one block of rows
  // A tile of 16 keys lies in one page when pages and chunks are multiples of 16 keys.
  const bool one_page = bs % kTile == 0 && chunk % kTile == 0;

  {  // q of the group, prescaled, as bf16 hi + lo; heads G..7 are zero
    const float scale = kLog2e / sqrtf(static_cast<float>(kD));
    const float* q = a.q + int64_t(t) * a.q_stride + int64_t(h) * G * kD;
    bf16* qb = reinterpret_cast<bf16*>(q_s);
    for (int i = threadIdx.x; i < 8 * kD; i += kThreads) {
      const float x = i < G * kD ? q[i] * scale : 0.0f;
      const bf16 hi = __float2bfloat16_rn(x);
      qb[i] = hi;
      qb[8 * kD + i] = __float2bfloat16_rn(x - __bfloat162float(hi));
    }
  }
  __syncthreads();

  constexpr int kMt = kD / 16;  // m-tiles of O^T
  float o[kMt][4];
#pragma unroll
  for (int i = 0; i < kMt; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m = kNoLogit, l = 0.0f;  // head r: running max (shared by the 4 lanes), this lane's sum

  for (int32_t base = warp * kTile; base < len; base += kWarps * kTile) {
    const int32_t s0 = begin + base;
    const bf16* tile = a.pool.kv + a.pool.RowOffset(__ldg(pages + s0 / bs), a.layer, h, 0, s0 % bs);
    auto row = [&](int32_t k) -> const bf16* {  // K row of the tile's key k (clamped to len)
      if (one_page) return tile + k * kD;
      const int32_t s = s0 + min(k, len - 1 - base);
      return a.pool.kv + a.pool.RowOffset(__ldg(pages + s / bs), a.layer, h, 0, s % bs);
    };
    uint4 kr[2][kD / 32], vr[4][kD / 64];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint4* p = reinterpret_cast<const uint4*>(row(j * 8 + r) + c * 8);
#pragma unroll
      for (int kk = 0; kk < kD / 32; ++kk) kr[j][kk] = __ldg(p + kk * 4);
    }
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const uint4* p =
          reinterpret_cast<const uint4*>(row((v / 2) * 8 + 2 * c + v % 2) + v_offset + r * 8);
#pragma unroll
      for (int blk = 0; blk < kD / 64; ++blk) vr[v][blk] = __ldg(p + blk * 8);
    }

    float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int kk = 0; kk < kD / 32; ++kk) {
      const uint4 qh = q_s[(r * kD + kk * 32 + c * 8) / 8];
      const uint4 ql = q_s[(8 * kD + r * kD + kk * 32 + c * 8) / 8];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint4 k = kr[j][kk];
        Mma(s[j], qh.x, 0u, qh.y, 0u, k.x, k.y);
        Mma(s[j], ql.x, 0u, ql.y, 0u, k.x, k.y);
        Mma(s[j], qh.z, 0u, qh.w, 0u, k.z, k.w);
        Mma(s[j], ql.z, 0u, ql.w, 0u, k.z, k.w);
      }
    }
    if (base + kTile > len) {  // the last tile: mask keys >= len (V rows may hold any bits)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if (base + j * 8 + 2 * c + e >= len) s[j][e] = kNoLogit;
        }
      }
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        if (base + (v / 2) * 8 + 2 * c + v % 2 >= len) {
#pragma unroll
          for (int blk = 0; blk < kD / 64; ++blk) vr[v][blk] = make_uint4(0, 0, 0, 0);
        }
      }
    }
    if (scores && r < G) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        *reinterpret_cast<float2*>(&lg[r * logit_keys + base + j * 8 + 2 * c]) =
            make_float2(s[j][0], s[j][1]);
      }
    }
    // Online softmax over head r's keys; the output's rescale only when some max grew.
    float mt = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
    mt = fmaxf(mt, m);
    if (__any_sync(0xffffffffu, mt > m)) {
      const float corr = exp2f(m - mt);
      l *= corr;
      // The lane's output columns are heads 2c and 2c + 1, whose factors live in lanes 8c, 8c + 4.
      const float ca = __shfl_sync(0xffffffffu, corr, 8 * c);
      const float cb = __shfl_sync(0xffffffffu, corr, 8 * c + 4);
#pragma unroll
      for (int i = 0; i < kMt; ++i) {
        o[i][0] *= ca;
        o[i][1] *= cb;
        o[i][2] *= ca;
        o[i][3] *= cb;
      }
      m = mt;
    }
    float p[2][2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        p[j][e] = exp2f(s[j][e] - m);
        l += p[j][e];
      }
    }
    const uint32_t b0 = PackBf16(p[0][0], p[0][1]), b1 = PackBf16(p[1][0], p[1][1]);
#pragma unroll
    for (int i = 0; i < kMt; ++i) {
      const int blk = i / 4, w = i % 4;
      const uint32_t x0 = Word(vr[0][blk], w), x1 = Word(vr[1][blk], w);
      const uint32_t x2 = Word(vr[2][blk], w), x3 = Word(vr[3][blk], w);
      Mma(o[i], __byte_perm(x0, x1, 0x5410), __byte_perm(x0, x1, 0x7632),
          __byte_perm(x2, x3, 0x5410), __byte_perm(x2, x3, 0x7632), b0, b1);
    }
  }

  // The warp's (max, sum) per head and its outputs into shared memory.
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  if (c == 0 && r < G) {
    wml[(warp * G + r) * 2] = m;
    wml[(warp * G + r) * 2 + 1] = l;
  }
#pragma unroll
  for (int i = 0; i < kMt; ++i) {
    const int d = (i / 4) * 64 + r * 8 + (i % 4) * 2;
    if (2 * c < G) {
      *reinterpret_cast<float2*>(&wacc[(warp * G + 2 * c) * kD + d]) =
          make_float2(o[i][0], o[i][2]);
    }
    if (2 * c + 1 < G) {
      *reinterpret_cast<float2*>(&wacc[(warp * G + 2 * c + 1) * kD + d]) =
          make_float2(o[i][1], o[i][3]);
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
  for (int i = threadIdx.x; i < G * kD; i += kThreads) {
    const int g = i / kD;
    float out = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      out += wacc[w * G * kD + i] * exp2f(wml[(w * G + g) * 2] - stat[g]);
    }
    if (nsplit == 1) {
      a.out[int64_t(t) * a.out_stride + int64_t(h) * G * kD + i] =
          __float2bfloat16_rn(out / stat[G + g]);
    } else {
      a.part_out[part * G * kD + i] = out;
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

// Lets the kernel take up to kMmaSmemBudget of dynamic shared memory (once per process); false
// without a device.
template <int kD>
bool OptIn() {
  static const bool ok = [] {
    if (cudaFuncSetAttribute(AttentionMmaKernel<kD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(kMmaSmemBudget)) != cudaSuccess) {
      cudaGetLastError();  // clear it
      return false;
    }
    return true;
  }();
  return ok;
}

// Resident blocks per SM as registers and threads allow (asked once per process); 0 without a
// device.
template <int kD>
int32_t BlocksPerSmBeforeSmem() {
  static const int32_t blocks = [] {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, AttentionMmaKernel<kD>, kThreads, 0) !=
        cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return b;
  }();
  return blocks;
}

}  // namespace

int32_t MmaBlocksPerSm(int32_t head_dim, int64_t smem_bytes) {
  const int32_t before =
      head_dim == 64 ? BlocksPerSmBeforeSmem<64>() : BlocksPerSmBeforeSmem<128>();
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

cudaError_t LaunchAttentionMma(const AttentionArgs& args, const AttentionPlan& plan,
                               cudaStream_t stream) {
  const int32_t G = args.group, hd = args.pool.head_dim;
  const int32_t logit_keys = plan.scores ? plan.chunk : 0;
  const int64_t smem = MmaSmemBytes(G, hd, logit_keys);
  if (!MmaSupports(hd) || smem > kMmaSmemBudget || plan.chunk % kTile != 0) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(args.step.num_tokens, args.pool.num_kv_heads, plan.max_splits);
  const int32_t c = plan.chunk, s = plan.max_splits;
  if (hd == 64) {
    if (smem > 48 * 1024 && !OptIn<64>()) return cudaErrorInvalidValue;
    AttentionMmaKernel<64><<<grid, kThreads, smem, stream>>>(args, c, s, logit_keys);
  } else {
    if (smem > 48 * 1024 && !OptIn<128>()) return cudaErrorInvalidValue;
    AttentionMmaKernel<128><<<grid, kThreads, smem, stream>>>(args, c, s, logit_keys);
  }
  return cudaGetLastError();
}

}  // namespace heavykv::cuda::internal
