// Parity of every CUDA kernel with its CPU reference (kernels/cpu, memory/kv_cache.cc) by
// normalised error. Inputs the GPU stores in bf16 are rounded to bf16 first, so the CPU sees the
// same values and the thresholds measure the kernels, not the storage: fp32 paths (RoPE, GEMM
// accumulation, scores) to ~1e-5, bf16 outputs to 1e-2 (bf16 keeps 8 bits: 2^-9 relative).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/cuda/device_step.h"
#include "engine/cuda/step_layout.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/evict.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/kv_append.cuh"
#include "kernels/cuda/paged_attention.cuh"
#include "kernels/cuda/qkv_bias_norm.cuh"
#include "kernels/cuda/rms_norm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/swiglu.cuh"
#include "memory/kv_cache.h"
#include "tests/cuda/cuda_test_util.h"

namespace heavykv {
namespace {

using testing::DeviceArray;
using testing::FromBf16;
using testing::NormalizedError;
using testing::RandomVector;
using testing::RoundBf16;
using testing::ToBf16;
using bf16 = __nv_bfloat16;

std::vector<float> Rounded(std::vector<float> v) {
  for (float& x : v) x = RoundBf16(x);
  return v;
}

TEST(CudaOpsTest, RmsNormMatchesCpu) {
  HEAVYKV_SKIP_WITHOUT_GPU();
  // eps 1e-6 (Qwen) on rows of mean square ~1e-4, where it is not negligible next to 1e-5.
  for (auto [dim, eps, scale] : {std::tuple<int64_t, float, float>{64, 1e-5f, 1.0f},
                                 {172, 1e-5f, 1.0f}, {2048, 1e-5f, 1.0f}, {896, 1e-6f, 0.02f}}) {
    const int64_t rows = 5;
    std::vector<float> x = RandomVector(rows * dim, 1, -scale, scale),
                       w = RandomVector(dim, 2, 0.5f, 1.5f);
    std::vector<float> want(rows * dim);
    cpu::RmsNorm(x.data(), w.data(), want.data(), rows, dim, eps);
    DeviceArray<float> dx(x), dw(w);
    DeviceArray<bf16> out(rows * dim);
    HEAVYKV_CUDA_OK(cuda::RmsNorm(dx.get(), dw.get(), out.get(), rows, dim, eps, nullptr, 0));
    EXPECT_LT(NormalizedError(FromBf16(out.Download()), want), 1e-2) << dim;
    // Gathered rows (the final norm): rows 4 and 1.
    DeviceArray<int32_t> idx(std::vector<int32_t>{4, 1});
    DeviceArray<bf16> out2(2 * dim);
    HEAVYKV_CUDA_OK(cuda::RmsNorm(dx.get(), dw.get(), out2.get(), 2, dim, eps, idx.get(), 0));
    std::vector<float> want2(want.begin() + 4 * dim, want.begin() + 5 * dim);
    want2.insert(want2.end(), want.begin() + dim, want.begin() + 2 * dim);
    EXPECT_LT(NormalizedError(FromBf16(out2.Download()), want2), 1e-2) << dim;
  }
}

TEST(CudaOpsTest, RopeMatchesCpu) {
  HEAVYKV_SKIP_WITHOUT_GPU();
  for (int64_t hd : {8, 48, 64, 128}) {
    const int64_t rows = 7, heads = 4, stride = heads * hd + 16, rot = (heads - 1) * hd;
    std::vector<float> x = RandomVector(rows * stride, 3);
    std::vector<int32_t> pos = {0, 1, 5, 100, 511, 4095, 131071};
    std::vector<float> want = x;
    cpu::Rope(want.data(), rows, stride, rot, hd, pos.data());
    DeviceArray<float> dx(x);
    DeviceArray<int32_t> dp(pos);
    DeviceArray<float> df(cuda::RopeInvFreq(hd));
    HEAVYKV_CUDA_OK(cuda::Rope(dx.get(), rows, stride, rot, hd, df.get(), false, dp.get(), 0));
    // Large angles amplify the libm / CUDA cosf differences of a few ulps.
    EXPECT_LT(NormalizedError(dx.Download(), want), 2e-5) << hd;
  }
}

// The table is built on the host (no GPU needed): the CPU Rope's frequencies bit for bit, for
// llama2.c's theta through pow in double, for the others through the CPU's own powf, and divided
// by Llama 3.1's factors as the CPU divides them.
TEST(CudaRopeTableTest, InvFreqIsTheCpusFrequency) {
  const std::vector<float> factors = RandomVector(128, 11, 1.0f, 7.0f);
  for (float theta : {10000.0f, 500000.0f, 1e6f}) {
    for (int64_t hd : {8, 32, 48, 64, 128, 256}) {
      for (const float* f : {static_cast<const float*>(nullptr), factors.data()}) {
        const std::vector<float> got = cuda::RopeInvFreq(hd, theta, f);
        ASSERT_EQ(got.size(), size_t(hd / 2));
        for (int64_t i = 0; i < hd; i += 2) {
          float want = 1.0f / powf(theta, i / (float)hd);  // kernels/cpu/ops.cc Rope
          if (f != nullptr) want /= f[i / 2];
          EXPECT_EQ(got[i / 2], want) << "theta " << theta << " hd " << hd << " i " << i;
        }
      }
    }
  }
}

// NEOX pairing, other thetas and rope_freqs factors (Qwen2/3, Llama 3.1) against kernels/cpu Rope.
TEST(CudaOpsTest, RopeNeoxThetaAndFactorsMatchCpu) {
  HEAVYKV_SKIP_WITHOUT_GPU();
  const std::vector<float> factors = RandomVector(64, 12, 1.0f, 7.0f);
  for (int64_t hd : {8, 32, 64, 128}) {
    for (float theta : {10000.0f, 500000.0f, 1e6f}) {
      for (bool neox : {false, true}) {
        for (bool with_factors : {false, true}) {
          SCOPED_TRACE(absl::StrCat("hd ", hd, " theta ", theta, " neox ", neox, " factors ",
                                    with_factors));
          const int64_t rows = 7, heads = 4, stride = heads * hd + 16, rot = (heads - 1) * hd;
          std::vector<float> x = RandomVector(rows * stride, 13);
          std::vector<int32_t> pos = {0, 1, 5, 100, 511, 4095, 131071};
          cpu::RopeParams p;
          p.head_dim = hd;
          p.theta = theta;
          p.neox = neox;
          p.freq_factors = with_factors ? factors.data() : nullptr;
          std::vector<float> want = x;
          cpu::Rope(want.data(), rows, stride, rot, pos.data(), p);
          DeviceArray<float> dx(x);
          DeviceArray<int32_t> dp(pos);
          DeviceArray<float> df(cuda::RopeInvFreq(hd, theta, p.freq_factors));
          HEAVYKV_CUDA_OK(cuda::Rope(dx.get(), rows, stride, rot, hd, df.get(), neox, dp.get(), 0));
          const std::vector<float> got = dx.Download();
          EXPECT_LT(NormalizedError(got, want), 2e-5);
          // Entries past rot_dim are not touched.
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t i = rot; i < stride; ++i) {
              ASSERT_EQ(got[r * stride + i], x[r * stride + i]);
            }
          }
        }
      }
    }
  }
}

// Bias (Qwen2) and per-head q/k RMSNorm (Qwen3) against the CPU forward's Add and RmsNorm.
TEST(CudaOpsTest, QkvBiasNormMatchesCpu) {
  HEAVYKV_SKIP_WITHOUT_GPU();
  for (int32_t hd : {8, 32, 64, 128, 256}) {
    for (int mode = 0; mode < 3; ++mode) {  // bias, norm, both
      SCOPED_TRACE(absl::StrCat("hd ", hd, " mode ", mode));
      const bool bias = mode != 1, norm = mode != 0;
      const int32_t heads = 6, kv_heads = 2, rows = 5;
      const int64_t q_dim = heads * hd, kv_dim = kv_heads * hd, qkv_dim = q_dim + 2 * kv_dim;
      const int64_t stride = qkv_dim + 8;  // the runner's rows are qkv_dim; any stride works
      const float eps = 1e-6f;
      std::vector<float> x = RandomVector(rows * stride, 21, -0.05f, 0.05f);
      const std::vector<float> b = RandomVector(qkv_dim, 22, -0.5f, 0.5f),
                               qn = RandomVector(hd, 23, 0.5f, 1.5f),
                               kn = RandomVector(hd, 24, 0.5f, 1.5f);
      std::vector<float> want = x;
      for (int32_t t = 0; t < rows; ++t) {
        float* row = &want[t * stride];
        if (bias) cpu::Add(row, b.data(), qkv_dim);
        if (norm) {
          cpu::RmsNorm(row, qn.data(), row, heads, hd, eps);
          cpu::RmsNorm(row + q_dim, kn.data(), row + q_dim, kv_heads, hd, eps);
        }
      }
      DeviceArray<float> dx(x), db(b), dqn(qn), dkn(kn);
      HEAVYKV_CUDA_OK(cuda::QkvBiasNorm(dx.get(), rows, stride, bias ? db.get() : nullptr,
                                        norm ? dqn.get() : nullptr, norm ? dkn.get() : nullptr,
                                        heads, kv_heads, hd, eps, 0));
      const std::vector<float> got = dx.Download();
      EXPECT_LT(NormalizedError(got, want), 1e-6);
      for (int32_t t = 0; t < rows; ++t) {  // the padding past qkv_dim is not touched
        for (int64_t i = qkv_dim; i < stride; ++i) ASSERT_EQ(got[t * stride + i], x[t * stride + i]);
      }
    }
  }
  EXPECT_EQ(cuda::QkvBiasNorm(nullptr, 1, 8, nullptr, nullptr, nullptr, 1, 1, 512, 1e-6f, 0),
            cudaErrorInvalidValue);
}

TEST(CudaOpsTest, SwiGluMatchesCpu) {
  HEAVYKV_SKIP_WITHOUT_GPU();
  const int64_t rows = 3, hidden = 172;
  std::vector<float> gu = RandomVector(rows * 2 * hidden, 4, -4.0f, 4.0f), want(rows * hidden);
  cpu::SwiGlu(gu.data(), want.data(), rows, hidden);
  DeviceArray<float> dgu(gu);
  DeviceArray<bf16> out(rows * hidden);
  HEAVYKV_CUDA_OK(cuda::SwiGlu(dgu.get(), out.get(), rows, hidden, 0));
  EXPECT_LT(NormalizedError(FromBf16(out.Download()), want), 1e-2);
}

TEST(CudaOpsTest, EmbeddingAndConversionAreExact) {
  HEAVYKV_SKIP_WITHOUT_GPU();
  const int64_t vocab = 50, dim = 72;
  std::vector<float> table = RandomVector(vocab * dim, 5);
  DeviceArray<float> dtable(table);
  DeviceArray<bf16> htable(vocab * dim);
  HEAVYKV_CUDA_OK(cuda::ConvertF32ToBf16(dtable.get(), htable.get(), vocab * dim, 0));
  const std::vector<float> rounded = Rounded(table);
  EXPECT_EQ(FromBf16(htable.Download()), rounded);
  std::vector<int32_t> tokens = {3, 0, 49, 3};
  DeviceArray<int32_t> dt(tokens);
  DeviceArray<float> out(tokens.size() * dim);
  HEAVYKV_CUDA_OK(cuda::Embedding(htable.get(), dt.get(), out.get(), tokens.size(), dim, 0));
  std::vector<float> want;
  for (int32_t t : tokens) want.insert(want.end(), rounded.begin() + t * dim, rounded.begin() + (t + 1) * dim);
  EXPECT_EQ(out.Download(), want);
}

TEST(CudaOpsTest, GemmMatchesFp32Reference) {
  HEAVYKV_SKIP_WITHOUT_GPU();
  cublasLtHandle_t lt;
  ASSERT_EQ(cuda::CreateGemmHandle(&lt), CUBLAS_STATUS_SUCCESS);
  DeviceArray<char> ws(32 << 20);
  struct Shape { int64_t m, n, k; };
  for (Shape s : {Shape{1, 512, 64}, Shape{3, 172, 64}, Shape{70, 96, 172}, Shape{64, 2048, 2048}}) {
    const std::vector<float> x = Rounded(RandomVector(s.m * s.k, 6)),
                             w = Rounded(RandomVector(s.n * s.k, 7));
    const std::vector<float> y0 = RandomVector(s.m * s.n, 8);
    std::vector<float> want(s.m * s.n), want_acc(s.m * s.n);
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < s.n; ++j) {
        double acc = 0;
        for (int64_t kk = 0; kk < s.k; ++kk) acc += double(x[i * s.k + kk]) * w[j * s.k + kk];
        want[i * s.n + j] = static_cast<float>(acc);
        want_acc[i * s.n + j] = static_cast<float>(acc + y0[i * s.n + j]);
      }
    }
    DeviceArray<bf16> dx(ToBf16(x)), dw(ToBf16(w));
    DeviceArray<float> dy(s.m * s.n);
    ASSERT_EQ(cuda::GemmBf16(lt, ws.get(), 32 << 20, dx.get(), dw.get(), dy.get(), s.m, s.n, s.k,
                             s.n, false, 0),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_LT(NormalizedError(dy.Download(), want), 1e-5) << s.m << "x" << s.n << "x" << s.k;
    dy.Upload(y0);
    ASSERT_EQ(cuda::GemmBf16(lt, ws.get(), 32 << 20, dx.get(), dw.get(), dy.get(), s.m, s.n, s.k,
                             s.n, true, 0),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_LT(NormalizedError(dy.Download(), want_acc), 1e-5) << "accumulate";
  }
  cuda::DestroyGemmHandle(lt);
}

// A host KvCache filled with bf16-representable K/V, and the same contents in the device pool's
// layout, for the attention, append and eviction tests.
struct PoolFixture {
  KvShape shape;
  std::unique_ptr<KvCache> cache;
  cuda::DeviceKvPool dev;  // layout only; pointers set by Upload
  std::vector<bf16> kv;
  std::vector<int32_t> pos;
  std::vector<float> score;

  PoolFixture(int32_t layers, int32_t kv_heads, int32_t head_dim, int32_t block_size,
              int32_t pages) {
    shape.num_layers = layers;
    shape.num_kv_heads = kv_heads;
    shape.head_dim = head_dim;
    shape.block_size = block_size;
    cache = *KvCache::Create(shape, pages);
    dev.num_layers = layers;
    dev.num_kv_heads = kv_heads;
    dev.head_dim = head_dim;
    dev.block_size = block_size;
    kv.assign(pages * dev.PageElems(), __float2bfloat16_rn(0.0f));
    pos.assign(pages * dev.PageMeta(), 0);
    score.assign(pages * dev.PageMeta(), 0.0f);
  }
  // Copies slots [0, n) of every (layer, head) of `seq` from the host cache into the image.
  void Snapshot(const SequenceKv& seq, int32_t n) {
    const int32_t bs = shape.block_size, hd = shape.head_dim;
    for (int32_t l = 0; l < shape.num_layers; ++l) {
      for (int32_t h = 0; h < shape.num_kv_heads; ++h) {
        PagedKvHead v = cache->View(seq, l, h, n);
        for (int32_t s = 0; s < n; ++s) {
          const int32_t page = seq.Table(0).pages[s / bs], row = s % bs;
          for (int32_t d = 0; d < hd; ++d) {
            kv[dev.RowOffset(page, l, h, 0, row) + d] = __float2bfloat16_rn(v.KRow(s)[d]);
            kv[dev.RowOffset(page, l, h, 1, row) + d] = __float2bfloat16_rn(v.VRow(s)[d]);
          }
          pos[dev.MetaOffset(page, l, h, row)] = v.Pos(s);
          score[dev.MetaOffset(page, l, h, row)] = v.Score(s);
        }
      }
    }
  }
  // Fills slots [0, n) with random bf16 K/V, positions 0.. and random scores.
  void Fill(const SequenceKv& seq, int32_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f), u01(0.0f, 1.0f);
    for (int32_t l = 0; l < shape.num_layers; ++l) {
      for (int32_t h = 0; h < shape.num_kv_heads; ++h) {
        PagedKvHead v = cache->View(seq, l, h, n);
        for (int32_t s = 0; s < n; ++s) {
          for (int32_t d = 0; d < shape.head_dim; ++d) {
            v.KRow(s)[d] = RoundBf16(u(rng));
            v.VRow(s)[d] = RoundBf16(u(rng));
          }
          v.Pos(s) = s;
          v.Score(s) = u01(rng);
        }
      }
    }
  }
};

// The step plan of `steps` in device memory.
struct DevicePlan {
  StepLayout layout;
  std::unique_ptr<DeviceArray<int32_t>> data;
  cuda::DeviceStep step;

  DevicePlan(std::span<const SequenceStep> steps, std::span<const EvictRule> rules,
             int32_t block_size) {
    EXPECT_TRUE(BuildStepLayout(steps, rules, block_size, &layout).ok());
    data = std::make_unique<DeviceArray<int32_t>>(layout.data);
    const int32_t* d = data->get();
    step = DeviceStepAt(layout, d);
  }
};

struct SeqSpec {
  int32_t num_old, num_new;
  bool scores;
};

int NumSms() {
  int device = 0, sms = 1;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  return sms;
}

// Attention of layer 1 over sequences `specs` on the CPU (PagedAttention) and the GPU, compared.
void CheckAttention(int32_t kv_heads, int32_t group, int32_t hd, const std::vector<SeqSpec>& specs,
                    int32_t max_chunk, bool expect_split, int32_t bs = 16) {
  SCOPED_TRACE(absl::StrCat("kv_heads ", kv_heads, " group ", group, " head_dim ", hd,
                            " max_chunk ", max_chunk, " block_size ", bs));
  const int32_t layers = 2;
  int32_t pages = 3;
  for (const SeqSpec& s : specs) pages += (s.num_old + s.num_new + bs - 1) / bs;
  PoolFixture f(layers, kv_heads, hd, bs, pages);
  // Slots no sequence holds read as NaN: a kernel must mask them, not multiply them by zero.
  std::fill(f.kv.begin(), f.kv.end(), __float2bfloat16_rn(std::nanf("")));
  auto h2o = *MakePolicy("h2o", 0.5);
  SequenceKv scramble;  // takes the first pages, so the sequences' tables are not 0, 1, 2, ...
  ASSERT_TRUE(f.cache->Reserve(scramble, 3 * bs).ok());
  std::vector<SequenceKv> seqs(specs.size());
  std::vector<std::vector<int32_t>> tokens(specs.size());
  std::vector<SequenceStep> steps;
  int64_t T = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    seqs[i].policy = specs[i].scores ? h2o.get() : nullptr;
    ASSERT_TRUE(f.cache->Reserve(seqs[i], specs[i].num_old + specs[i].num_new).ok());
    seqs[i].tables[0].num_slots = specs[i].num_old;
    f.Fill(seqs[i], specs[i].num_old + specs[i].num_new, 10 + i);
    f.Snapshot(seqs[i], specs[i].num_old + specs[i].num_new);
    tokens[i].assign(specs[i].num_new, 0);
    T += specs[i].num_new;
  }
  f.cache->Release(scramble);
  for (size_t i = 0; i < specs.size(); ++i) {
    steps.push_back({&seqs[i], tokens[i], specs[i].num_old, false});
  }
  const int32_t heads = kv_heads * group, stride = heads * hd;
  const std::vector<float> q = RandomVector(T * stride, 99, -2.0f, 2.0f);

  // CPU, layer 1.
  std::vector<float> want(T * stride, 0.0f);
  int64_t t0 = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const int32_t held = specs[i].num_old + specs[i].num_new;
    for (int32_t h = 0; h < kv_heads; ++h) {
      cpu::AttentionArgs a;
      a.kv = f.cache->View(seqs[i], 1, h, held);
      a.num_old = specs[i].num_old;
      a.num_q = specs[i].num_new;
      a.group = group;
      a.q = &q[t0 * stride + int64_t(h) * group * hd];
      a.q_stride = stride;
      a.out = &want[t0 * stride + int64_t(h) * group * hd];
      a.out_stride = stride;
      if (specs[i].scores) a.channel.kind = SlotChannel::kAccumulated;
      std::vector<float> scratch(cpu::AttentionScratchFloats(held, group, specs[i].num_new));
      cpu::PagedAttention(a, scratch.data());
    }
    t0 += specs[i].num_new;
  }

  // GPU, every split kernel, each on a fresh copy of the pool (kMma plans kStream for head dims
  // other than 64 and 128).
  std::vector<EvictRule> rules(specs.size());
  DevicePlan plan(steps, rules, bs);
  using cuda::AttentionKernel;
  for (AttentionKernel kernel :
       {AttentionKernel::kMma, AttentionKernel::kStream, AttentionKernel::kTwoPass}) {
    SCOPED_TRACE(cuda::AttentionKernelName(kernel));
    const cuda::AttentionPlan ap = cuda::PlanAttention(
        plan.layout.num_tokens, kv_heads, group, hd, plan.layout.max_held, plan.layout.any_scores,
        NumSms(), max_chunk, kernel);
    if (kernel == AttentionKernel::kMma) {
      const bool mma_dims = hd == 64 || hd == 128;
      EXPECT_EQ(ap.kernel, mma_dims ? AttentionKernel::kMma : AttentionKernel::kStream);
    }
    if (expect_split) {
      EXPECT_GT(ap.max_splits, 1);
    }
    DeviceArray<bf16> dkv(f.kv);
    DeviceArray<int32_t> dpos(f.pos);
    DeviceArray<float> dscore(f.score), dq(q);
    DeviceArray<bf16> dout(T * stride);
    DeviceArray<float> po(std::max<int64_t>(1, ap.part_out_floats)),
        pm(std::max<int64_t>(1, ap.part_ml_floats)), pe(std::max<int64_t>(1, ap.part_e_floats));
    cuda::AttentionArgs a;
    a.pool = f.dev;
    a.pool.kv = dkv.get();
    a.pool.pos = dpos.get();
    a.pool.score = dscore.get();
    a.step = plan.step;
    a.layer = 1;
    a.group = group;
    a.q = dq.get();
    a.q_stride = stride;
    a.out = dout.get();
    a.out_stride = stride;
    a.part_out = po.get();
    a.part_ml = pm.get();
    a.part_e = pe.get();
    HEAVYKV_CUDA_OK(cuda::PagedAttention(a, ap, 0));
    EXPECT_LT(NormalizedError(FromBf16(dout.Download()), want), 1e-2);

    // Scores: compare every slot of layer 1 (those without accumulation must be unchanged).
    const std::vector<float> got_score = dscore.Download();
    std::vector<float> got, expect;
    for (size_t i = 0; i < specs.size(); ++i) {
      const int32_t held = specs[i].num_old + specs[i].num_new;
      for (int32_t h = 0; h < kv_heads; ++h) {
        PagedKvHead v = f.cache->View(seqs[i], 1, h, held);
        for (int32_t s = 0; s < held; ++s) {
          got.push_back(got_score[f.dev.MetaOffset(seqs[i].Table(0).pages[s / bs], 1, h, s % bs)]);
          expect.push_back(v.Score(s));
        }
      }
    }
    EXPECT_LT(NormalizedError(got, expect), 1e-5);
  }
}

TEST(CudaAttentionTest, DecodeMatchesCpu) {
  HEAVYKV_SKIP_WITHOUT_GPU();
  const std::vector<SeqSpec> specs = {{0, 1, true}, {37, 1, true}, {15, 1, false}, {300, 1, true}};
  CheckAttention(2, 4, 64, specs, 0, false);
  CheckAttention(4, 2, 8, specs, 0, false);    // the bundled model's shape
  CheckAttention(3, 1, 48, specs, 0, false);   // stories15M's head_dim, no GQA
  CheckAttention(8, 4, 128, specs, 0, false);  // Llama-3 8B shape
  CheckAttention(1, 8, 256, specs, 0, false);
}

TEST(CudaAttentionTest, PrefillChunksAreCausalAndScoreEveryQuery) {
  HEAVYKV_SKIP_WITHOUT_GPU();
  const std::vector<SeqSpec> specs = {{0, 9, true}, {20, 5, true}, {33, 1, true}, {7, 17, false}};
  CheckAttention(2, 4, 64, specs, 0, false);
  CheckAttention(4, 2, 8, specs, 0, false);
}

TEST(CudaAttentionTest, SplitKRescalesOutputsAndScores) {
  HEAVYKV_SKIP_WITHOUT_GPU();
  // Long contexts split by the plan (smem limit), and short ones forced into 32-key splits.
  CheckAttention(2, 4, 64, {{5000, 1, true}, {3100, 2, true}, {40, 1, true}}, 0, true);
  CheckAttention(2, 4, 64, {{200, 1, true}, {150, 6, true}, {10, 1, false}}, 32, true);
  CheckAttention(4, 2, 8, {{500, 3, true}, {63, 1, true}}, 64, true);
  CheckAttention(8, 4, 128, {{4100, 1, true}, {2000, 3, true}, {70, 1, false}}, 0, false);
  CheckAttention(2, 8, 128, {{700, 1, true}, {300, 4, true}}, 128, true);
}

TEST(CudaAttentionTest, PagesNotAMultipleOfTheMmaTile) {
  HEAVYKV_SKIP_WITHOUT_GPU();
  // The mma kernel addresses a 16-key tile row by row when pages hold 8 or 24 keys.
  const std::vector<SeqSpec> specs = {{0, 1, true}, {37, 1, true}, {300, 2, true}, {15, 1, false}};
  CheckAttention(2, 4, 64, specs, 0, false, 8);
  CheckAttention(2, 4, 128, specs, 64, true, 24);
  CheckAttention(1, 2, 64, specs, 0, false, 32);
}

TEST(CudaKvAppendTest, WritesRowsPositionsAndZeroScores) {
  HEAVYKV_SKIP_WITHOUT_GPU();
  const int32_t bs = 4, kv_heads = 2, hd = 16, layers = 2;
  PoolFixture f(layers, kv_heads, hd, bs, 8);
  SequenceKv a, b;
  ASSERT_TRUE(f.cache->Reserve(a, 6).ok());  // 2 old + 4 new slots
  a.tables[0].num_slots = 2;
  ASSERT_TRUE(f.cache->Reserve(b, 1).ok());
  const std::vector<int32_t> ta(4, 0), tb(1, 0);
  const SequenceStep steps[] = {{&a, ta, 10, false}, {&b, tb, 0, false}};
  const EvictRule rules[2] = {};
  DevicePlan plan(steps, rules, bs);
  const int64_t dim = 64, kv_dim = kv_heads * hd, qkv_dim = dim + 2 * kv_dim;
  const std::vector<float> qkv = RandomVector(5 * qkv_dim, 3);
  DeviceArray<bf16> dkv(f.kv);
  DeviceArray<int32_t> dpos(std::vector<int32_t>(f.pos.size(), -1));
  DeviceArray<float> dscore(std::vector<float>(f.score.size(), 7.0f)), dqkv(qkv);
  cuda::DeviceKvPool pool = f.dev;
  pool.kv = dkv.get();
  pool.pos = dpos.get();
  pool.score = dscore.get();
  HEAVYKV_CUDA_OK(cuda::KvAppend(pool, plan.step, 1, dqkv.get(), qkv_dim, dim, dim + kv_dim, 0));
  const std::vector<bf16> kv = dkv.Download();
  const std::vector<int32_t> pos = dpos.Download();
  const std::vector<float> score = dscore.Download();
  struct Row { const SequenceKv* seq; int32_t slot, token, position; };
  for (Row r : {Row{&a, 2, 0, 10}, Row{&a, 3, 1, 11}, Row{&a, 5, 3, 13}, Row{&b, 0, 4, 0}}) {
    const int32_t page = r.seq->Table(0).pages[r.slot / bs], row = r.slot % bs;
    for (int32_t h = 0; h < kv_heads; ++h) {
      for (int32_t d = 0; d < hd; ++d) {
        EXPECT_EQ(__bfloat162float(kv[f.dev.RowOffset(page, 1, h, 0, row) + d]),
                  RoundBf16(qkv[r.token * qkv_dim + dim + h * hd + d]));
        EXPECT_EQ(__bfloat162float(kv[f.dev.RowOffset(page, 1, h, 1, row) + d]),
                  RoundBf16(qkv[r.token * qkv_dim + dim + kv_dim + h * hd + d]));
      }
      EXPECT_EQ(pos[f.dev.MetaOffset(page, 1, h, row)], r.position);
      EXPECT_EQ(score[f.dev.MetaOffset(page, 1, h, row)], 0.0f);
      EXPECT_EQ(pos[f.dev.MetaOffset(page, 0, h, row)], -1);  // other layers untouched
    }
  }
}

TEST(CudaKvAppendTest, RopeKvAppendMatchesRopeThenKvAppend) {
  HEAVYKV_SKIP_WITHOUT_GPU();
  const std::vector<float> factors = RandomVector(64, 9, 1.0f, 7.0f);
  for (auto [hd, neox] : {std::pair<int32_t, bool>{8, false}, {64, false}, {128, false},
                          {8, true}, {32, true}, {128, true}}) {
    SCOPED_TRACE(absl::StrCat("hd ", hd, " neox ", neox));
    const int32_t bs = 16, kv_heads = 2, layers = 2;
    PoolFixture f(layers, kv_heads, hd, bs, 8);
    SequenceKv a, b;
    ASSERT_TRUE(f.cache->Reserve(a, 21).ok());  // 17 old + 4 new slots
    a.tables[0].num_slots = 17;
    ASSERT_TRUE(f.cache->Reserve(b, 1).ok());
    const std::vector<int32_t> ta(4, 0), tb(1, 0);
    const SequenceStep steps[] = {{&a, ta, 131000, false}, {&b, tb, 3, false}};
    const EvictRule rules[2] = {};
    DevicePlan plan(steps, rules, bs);
    const int64_t dim = 4 * hd, kv_dim = kv_heads * hd, qkv_dim = dim + 2 * kv_dim;
    const std::vector<float> qkv = RandomVector(5 * qkv_dim, 5);
    const DeviceArray<float> freq(
        neox ? cuda::RopeInvFreq(hd, 1e6f, factors.data()) : cuda::RopeInvFreq(hd));
    std::vector<bf16> kv_out[2];
    std::vector<int32_t> pos_out[2];
    std::vector<float> score_out[2], qkv_out[2];
    for (int fused = 0; fused < 2; ++fused) {
      DeviceArray<bf16> dkv(f.kv);
      DeviceArray<int32_t> dpos(std::vector<int32_t>(f.pos.size(), -1));
      DeviceArray<float> dscore(std::vector<float>(f.score.size(), 7.0f)), dqkv(qkv);
      cuda::DeviceKvPool pool = f.dev;
      pool.kv = dkv.get();
      pool.pos = dpos.get();
      pool.score = dscore.get();
      if (fused) {
        HEAVYKV_CUDA_OK(cuda::RopeKvAppend(pool, plan.step, 1, dqkv.get(), qkv_dim, dim,
                                           dim + kv_dim, freq.get(), neox, 0));
      } else {
        HEAVYKV_CUDA_OK(cuda::Rope(dqkv.get(), 5, qkv_dim, dim + kv_dim, hd, freq.get(), neox,
                                   plan.step.token_pos, 0));
        HEAVYKV_CUDA_OK(
            cuda::KvAppend(pool, plan.step, 1, dqkv.get(), qkv_dim, dim, dim + kv_dim, 0));
      }
      kv_out[fused] = dkv.Download();
      pos_out[fused] = dpos.Download();
      score_out[fused] = dscore.Download();
      qkv_out[fused] = dqkv.Download();
    }
    EXPECT_LT(NormalizedError(qkv_out[1], qkv_out[0]), 1e-6);
    EXPECT_LT(NormalizedError(FromBf16(kv_out[1]), FromBf16(kv_out[0])), 1e-5);
    EXPECT_EQ(pos_out[1], pos_out[0]);
    EXPECT_EQ(score_out[1], score_out[0]);
  }
}

struct EvictSpec {
  const char* policy;
  double recent_fraction;
  int32_t budget, num_old, num_new;
  bool tied_scores;
};

// Eviction of layer 1 by KvCache::EvictHead (CPU) and EvictLayer (GPU) on the same contents:
// the same tokens must survive in the same slots with the same K/V, positions and scores.
TEST(CudaEvictTest, KeepsTheSameSlotsAsTheCpu) {
  HEAVYKV_SKIP_WITHOUT_GPU();
  const std::vector<EvictSpec> specs = {
      {"h2o", 0.5, 8, 8, 1, false},   {"h2o", 0.25, 10, 10, 5, false}, {"h2o", 0.5, 12, 12, 9, true},
      {"window", 0.5, 8, 8, 3, false}, {"sink", 0.5, 9, 9, 4, false},  {"sink", 0.5, 3, 3, 1, false},
      {"h2o", 0.2, 40, 40, 1, true},  {"h2o", 0.5, 30, 12, 4, false},  // under budget: no change
      {"window", 0.5, 5, 0, 7, false}};  // a first prefill chunk over budget
  const int32_t bs = 4, kv_heads = 3, hd = 16, layers = 2;
  int32_t pages = 0;
  for (const EvictSpec& s : specs) pages += (s.num_old + s.num_new + bs - 1) / bs;
  PoolFixture f(layers, kv_heads, hd, bs, pages);
  std::vector<std::unique_ptr<EvictionPolicy>> policies;
  std::vector<SequenceKv> seqs(specs.size());
  std::vector<std::vector<int32_t>> tokens(specs.size());
  std::vector<SequenceStep> steps;
  std::vector<EvictRule> rules;
  std::mt19937 rng(5);
  for (size_t i = 0; i < specs.size(); ++i) {
    const EvictSpec& s = specs[i];
    policies.push_back(*MakePolicy(s.policy, s.recent_fraction));
    seqs[i].policy = policies.back().get();
    seqs[i].budget = s.budget;
    const int32_t held = s.num_old + s.num_new;
    ASSERT_TRUE(f.cache->Reserve(seqs[i], held).ok());
    seqs[i].tables[0].num_slots = s.num_old;
    f.Fill(seqs[i], held, 20 + i);
    // Old slots hold distinct older positions in shuffled slot order (earlier compactions); the
    // new ones the step's positions. Scores distinct, or from 4 values to exercise tie-breaking.
    const int32_t start = s.num_old + 6;
    for (int32_t l = 0; l < layers; ++l) {
      for (int32_t h = 0; h < kv_heads; ++h) {
        std::vector<int32_t> older(start);
        std::iota(older.begin(), older.end(), 0);
        std::shuffle(older.begin(), older.end(), rng);
        PagedKvHead v = f.cache->View(seqs[i], l, h, held);
        for (int32_t sl = 0; sl < held; ++sl) {
          v.Pos(sl) = sl < s.num_old ? older[sl] : start + (sl - s.num_old);
          v.Score(sl) = s.tied_scores ? float(rng() % 4) * 0.5f : float(rng() % 100000) / 997.0f;
        }
      }
    }
    f.Snapshot(seqs[i], held);
    tokens[i].assign(s.num_new, 0);
    steps.push_back({&seqs[i], tokens[i], start, false});
    rules.push_back(*EvictRuleFor(seqs[i].policy, s.budget));
  }
  DevicePlan plan(steps, rules, bs);
  DeviceArray<bf16> dkv(f.kv);
  DeviceArray<int32_t> dpos(f.pos), derr(std::vector<int32_t>{0});
  DeviceArray<float> dscore(f.score);
  cuda::DeviceKvPool pool = f.dev;
  pool.kv = dkv.get();
  pool.pos = dpos.get();
  pool.score = dscore.get();
  HEAVYKV_CUDA_OK(cuda::EvictLayer(pool, plan.step, 1, plan.layout.max_held, derr.get(), 0));
  for (size_t i = 0; i < specs.size(); ++i) {
    const int32_t held = specs[i].num_old + specs[i].num_new;
    for (int32_t h = 0; h < kv_heads; ++h) {
      f.cache->EvictHead(seqs[i], 1, h, held, steps[i].start_pos + specs[i].num_new - 1);
    }
  }
  EXPECT_EQ(derr.Download()[0], 0);
  const std::vector<bf16> kv = dkv.Download();
  const std::vector<int32_t> pos = dpos.Download();
  const std::vector<float> score = dscore.Download();
  for (size_t i = 0; i < specs.size(); ++i) {
    const int32_t kept = std::min(specs[i].budget, specs[i].num_old + specs[i].num_new);
    for (int32_t l = 0; l < layers; ++l) {
      for (int32_t h = 0; h < kv_heads; ++h) {
        PagedKvHead v = f.cache->View(seqs[i], l, h, kept);
        for (int32_t s = 0; s < kept; ++s) {
          const int32_t page = seqs[i].Table(0).pages[s / bs], row = s % bs;
          SCOPED_TRACE(absl::StrCat(specs[i].policy, " spec ", i, " layer ", l, " head ", h,
                                    " slot ", s));
          EXPECT_EQ(pos[f.dev.MetaOffset(page, l, h, row)], v.Pos(s));
          EXPECT_EQ(score[f.dev.MetaOffset(page, l, h, row)], v.Score(s));
          EXPECT_EQ(__bfloat162float(kv[f.dev.RowOffset(page, l, h, 0, row)]), v.KRow(s)[0]);
          EXPECT_EQ(__bfloat162float(kv[f.dev.RowOffset(page, l, h, 1, row) + hd - 1]),
                    v.VRow(s)[hd - 1]);
        }
      }
    }
  }
}

}  // namespace
}  // namespace heavykv
