// The CUDA benchmarks (issue #5), registered as the cuda/ family when built with HEAVYKV_CUDA;
// each skips with "no CUDA device" where there is none. GPU time is measured with CUDA events
// (manual time), and every target ratio is formed inside one benchmark from figures measured
// side by side, then reported as a counter (and so in --summary_json):
//
//   cuda/bandwidth/d2d                  device-to-device copy: hbm_bytes_per_second (read+write)
//   cuda/attention/decode/b64/ctx4096/q32kv8/hd128/{noscores,scores}[/chunkN]/{stream,two-pass}
//                                       kv_bytes_per_second, frac_of_4.8TBps (>= 0.70),
//                                       frac_of_d2d; scores: time_vs_noscores (<= 1.10); the
//                                       two split kernels of paged_attention.cuh side by side
//   cuda/decode/llama3-1b/b64/ctx1024   one engine decode step, random llama3-1b weights:
//                                       vs_bound = step / ((weights + KV) / 4.8 TB/s) (<= 1.5),
//                                       with the default attention kernel (HEAVYKV_CUDA_ATTENTION);
//                                       HEAVYKV_PROFILE_STEP=1 brackets one extra step with
//                                       cudaProfilerStart/Stop (ncu --profile-from-start off)
//   cuda/capacity/len4096/h2o20-vs-full sequences of 4096 tokens resident in one pool, real
//                                       GPU forward passes: ratio (>= 4.5)
//   cuda/quant_gemv/llama3.2-1b/bM/FORMAT
//                                       the QuantGemv launches of one decode step at the
//                                       llama3.2-1b shape (16 layers' wqkv, wo, w13, w2 and the
//                                       128256-row classifier), batch M, weights in FORMAT
//                                       (q4_K+q6_K: Q4_K matrices, Q6_K classifier, as Q4_K_M):
//                                       weight_bytes (the blocks' real bytes), frac_of_4.8TBps
//                                       (issue 32: >= 0.70 at b1), frac_of_d2d
//   cuda/decode/llama3.2-1b-q4_k_m/b{1,64}/ctx1024/{bf16,quantized}
//                                       one engine decode step on a random Q4_K_M llama3.2-1b
//                                       GGUF (written once, ~0.8 GB), --gpu-weights bf16 vs
//                                       quantized in the same run: vs_bound on each one's real
//                                       weight bytes, device_weight_bytes
// The quant_gemv and q4_k_m decode benchmarks (issue 32) have NEVER RUN: no GPU was lent to the
// session that wrote them.
// The llama3-1b checkpoint (5 GB) is written once into $HEAVYKV_BENCH_DIR (default
// /tmp/heavykv-bench).
#include <benchmark/benchmark.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_model_runner.h"
#include "engine/cuda/device_step.h"
#include "engine/cuda/step_layout.h"
#include "engine/gguf/gguf_weight_mix.h"
#include "engine/model/make_gguf_model.h"
#include "engine/model/make_model.h"
#include "kernels/cpu/quant_types.h"
#include "kernels/cuda/paged_attention.cuh"
#include "kernels/cuda/quant_gemv.cuh"
#include "kernels/cuda/synthetic_kv.cuh"

namespace heavykv::bench {
namespace {

constexpr double kHbmBytesPerSecond = 4.8e12;  // H200 HBM3e, the reference

std::string ScratchDir() {
  const char* d = std::getenv("HEAVYKV_BENCH_DIR");
  return d != nullptr && *d ? d : "/tmp/heavykv-bench";
}

bool SkipWithoutGpu(benchmark::State& state) {
  if (HasCudaDevice()) return false;
  state.SkipWithError("no CUDA device");
  return true;
}

bool Check(benchmark::State& state, cudaError_t e) {
  if (e == cudaSuccess) return true;
  state.SkipWithError(cudaGetErrorString(e));
  return false;
}

// Times `fn` (which enqueues GPU work on the default stream): `reps` runs, seconds per run.
template <typename Fn>
double TimeGpu(Fn fn, int reps) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  fn();  // warm-up
  cudaEventRecord(a);
  for (int i = 0; i < reps; ++i) fn();
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms * 1e-3 / reps;
}

// Read + write bytes per second of a 1 GiB device-to-device copy, measured once per run.
double D2dBandwidth() {
  static const double bw = [] {
    const size_t n = size_t(1) << 30;
    void *src = nullptr, *dst = nullptr;
    if (cudaMalloc(&src, n) != cudaSuccess || cudaMalloc(&dst, n) != cudaSuccess) return 0.0;
    cudaMemset(src, 1, n);
    const double s = TimeGpu([&] { cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice); }, 10);
    cudaFree(src);
    cudaFree(dst);
    return 2.0 * n / s;
  }();
  return bw;
}

void BM_D2d(benchmark::State& state) {
  if (SkipWithoutGpu(state)) return;
  const double bw = D2dBandwidth();
  for (auto _ : state) state.SetIterationTime((size_t(1) << 31) / bw);
  state.counters["hbm_bytes_per_second"] = bw;
  state.counters["frac_of_4.8TBps"] = bw / kHbmBytesPerSecond;
}

// Decode attention alone: `batch` sequences of `context` cached tokens, one new query each,
// q_heads / kv_heads, head_dim, bf16 K/V, one layer, block tables over shuffled pages.
void BM_DecodeAttention(benchmark::State& state, bool scores, int32_t max_chunk,
                        cuda::AttentionKernel kernel) {
  if (SkipWithoutGpu(state)) return;
  constexpr int32_t kBatch = 64, kContext = 4096, kQHeads = 32, kKvHeads = 8, kHd = 128, kBs = 16;
  const int32_t pages_per_seq = kContext / kBs, pages = kBatch * pages_per_seq;
  cuda::DeviceKvPool pool;
  pool.num_layers = 1;
  pool.num_kv_heads = kKvHeads;
  pool.head_dim = kHd;
  pool.block_size = kBs;
  void *kv = nullptr, *pos = nullptr, *score = nullptr, *q = nullptr, *out = nullptr;
  if (!Check(state, cudaMalloc(&kv, pages * pool.PageElems() * 2)) ||
      !Check(state, cudaMalloc(&pos, pages * pool.PageMeta() * 4)) ||
      !Check(state, cudaMalloc(&score, pages * pool.PageMeta() * 4)) ||
      !Check(state, cudaMalloc(&q, kBatch * kQHeads * kHd * 4)) ||
      !Check(state, cudaMalloc(&out, kBatch * kQHeads * kHd * 2))) {
    return;
  }
  pool.kv = static_cast<cuda::bf16*>(kv);
  pool.pos = static_cast<int32_t*>(pos);
  pool.score = static_cast<float*>(score);
  cudaMemset(q, 0, kBatch * kQHeads * kHd * 4);
  std::vector<int32_t> ids(pages);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(3));
  auto h2o = *MakePolicy("h2o", 0.5);
  std::vector<SequenceKv> seqs(kBatch);
  std::vector<SequenceStep> steps;
  const int32_t token = 0;
  for (int32_t i = 0; i < kBatch; ++i) {
    // + the new token: kContext keys
    const auto first = ids.begin() + i * pages_per_seq;
    seqs[i].tables = {KvTable{{first, first + pages_per_seq}, kContext - 1}};
    seqs[i].policy = scores ? h2o.get() : nullptr;
    steps.push_back({&seqs[i], {&token, 1}, kContext - 1, false});
  }
  std::vector<EvictRule> rules(kBatch);
  StepLayout L;
  if (!BuildStepLayout(steps, rules, kBs, &L).ok()) return state.SkipWithError("layout");
  int32_t* meta = nullptr;
  cudaMalloc(&meta, L.data.size() * 4);
  cudaMemcpy(meta, L.data.data(), L.data.size() * 4, cudaMemcpyHostToDevice);
  for (int32_t i = 0; i < kBatch; ++i) {
    cuda::FillSyntheticKv(pool, meta + L.page_ids + i * pages_per_seq, kContext, i, nullptr);
  }
  int device = 0, sms = 1;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  cuda::AttentionArgs a;
  a.pool = pool;
  a.step = DeviceStepAt(L, meta);
  a.group = kQHeads / kKvHeads;
  a.q = static_cast<float*>(q);
  a.q_stride = kQHeads * kHd;
  a.out = static_cast<cuda::bf16*>(out);
  a.out_stride = kQHeads * kHd;
  auto plan_for = [&](bool with_scores) {
    return cuda::PlanAttention(L.num_tokens, kKvHeads, a.group, kHd, kContext, with_scores, sms,
                               max_chunk, kernel);
  };
  const cuda::AttentionPlan plan = plan_for(scores);
  const cuda::AttentionPlan plain = plan_for(false);  // sized for both: the larger scratch
  void *po = nullptr, *pm = nullptr, *pe = nullptr;
  cudaMalloc(&po, std::max<int64_t>({1, plan.part_out_floats, plain.part_out_floats}) * 4);
  cudaMalloc(&pm, std::max<int64_t>({1, plan.part_ml_floats, plain.part_ml_floats}) * 4);
  cudaMalloc(&pe, std::max<int64_t>(1, plan.part_e_floats) * 4);
  a.part_out = static_cast<float*>(po);
  a.part_ml = static_cast<float*>(pm);
  a.part_e = static_cast<float*>(pe);
  auto run = [&] { cuda::PagedAttention(a, plan, nullptr); };
  double seconds = 0;
  for (auto _ : state) {
    seconds = TimeGpu(run, 20);
    state.SetIterationTime(seconds);
  }
  if (!Check(state, cudaGetLastError())) return;
  const double bytes = double(kBatch) * kKvHeads * kContext * kHd * 2 * 2;  // K and V, bf16
  const double bw = bytes / seconds;
  state.counters["kv_bytes_per_second"] = bw;
  state.counters["frac_of_4.8TBps"] = bw / kHbmBytesPerSecond;
  state.counters["frac_of_d2d"] = bw / D2dBandwidth();
  state.counters["chunk"] = plan.chunk;
  state.counters["splits"] = plan.max_splits;
  if (scores) {  // the same kernel without accumulation, side by side
    state.counters["noscores_splits"] = plain.max_splits;
    const int32_t* no_scores = meta + L.evict_kind;  // all zeros: kEvictNone for every sequence
    a.step.accumulate = no_scores;
    const double base = TimeGpu([&] { cuda::PagedAttention(a, plain, nullptr); }, 20);
    state.counters["time_vs_noscores"] = seconds / base;
  }
  for (void* p : {kv, pos, score, q, out, po, pm, pe, static_cast<void*>(meta)}) cudaFree(p);
}

const Model* Llama3_1b() {
  static const Model* model = [] {
    ModelConfig c = *NamedShape("llama3-1b");
    std::filesystem::create_directories(ScratchDir());
    const std::string path = ScratchDir() + "/llama3-1b.bin";
    absl::StatusOr<ModelConfig> have = ReadModelConfig(path);
    if (!have.ok() || have->dim != c.dim || have->seq_len != c.seq_len) {
      if (!WriteRandomModel(c, 1, path).ok()) return static_cast<Model*>(nullptr);
    }
    absl::StatusOr<Model> m = LoadModel(path);
    return m.ok() ? new Model(*std::move(m)) : nullptr;
  }();
  return model;
}

// A random llama3.2-1b GGUF in llama-quantize's Q4_K_M mix (make-model's writer), written once
// into ScratchDir.
const Model* Llama32_1bQ4KM() {
  static const Model* model = [] {
    std::filesystem::create_directories(ScratchDir());
    const std::string path = ScratchDir() + "/llama3.2-1b-q4_k_m.gguf";
    absl::StatusOr<Model> m = LoadModel(path);
    if (!m.ok()) {
      RandomGgufOptions o;
      o.config = *NamedShape("llama3.2-1b");
      o.weights = *ParseGgufWeightMix("q4_k_m");
      if (!WriteRandomGgufModel(o, path).ok()) return static_cast<Model*>(nullptr);
      m = LoadModel(path);
    }
    return m.ok() ? new Model(*std::move(m)) : nullptr;
  }();
  return model;
}

// One decode step of the engine's CUDA runner at batch `batch`, every sequence at `context`
// cached tokens (synthetic K/V), rolled back after each step so every step runs at the same
// context.
void RunDecode(benchmark::State& state, const Model* model, int32_t batch, int32_t context,
               const StepRunnerOptions& options) {
  if (model == nullptr) return state.SkipWithError("cannot write or load the model");
  const ModelConfig& c = model->config;
  const KvShape shape = KvShapeForDevice(Device::kCuda, c, 16);
  const int32_t pages = batch * (context / 16 + 2);
  auto cache = CreateKvCache(Device::kCuda, shape, pages);
  if (!cache.ok()) return state.SkipWithError(std::string(cache.status().message()).c_str());
  auto runner = CudaModelRunner::Create(*model, cache->get(), options);
  if (!runner.ok()) return state.SkipWithError(std::string(runner.status().message()).c_str());
  std::vector<SequenceKv> seqs(batch);
  for (int32_t i = 0; i < batch; ++i) {
    if (!(*runner)->FillSyntheticKv(seqs[i], context, i).ok()) return state.SkipWithError("fill");
  }
  std::vector<int32_t> tokens(batch, 300);
  std::vector<SequenceStep> steps;
  for (int32_t i = 0; i < batch; ++i) steps.push_back({&seqs[i], {&tokens[i], 1}, context, false});
  auto step = [&](bool copy) {
    absl::Status s = copy ? (*runner)->Forward(steps).status() : (*runner)->ForwardOnDevice(steps);
    if (s.ok()) s = (*runner)->Synchronize();
    for (SequenceKv& kv : seqs) (*cache)->Truncate(kv, context);
    return s;
  };
  if (!step(true).ok()) return state.SkipWithError("decode step failed");  // warm-up
  if (const char* p = std::getenv("HEAVYKV_PROFILE_STEP"); p != nullptr && *p == '1') {
    cudaProfilerStart();
    const absl::Status s = step(false);
    cudaProfilerStop();
    if (!s.ok()) return state.SkipWithError("decode step failed");
  }
  using Clock = std::chrono::steady_clock;
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    if (!step(false).ok()) return state.SkipWithError("decode step failed");
    seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    state.SetIterationTime(seconds);
  }
  const auto t0 = Clock::now();
  for (int i = 0; i < 5; ++i) {
    if (!step(true).ok()) return state.SkipWithError("decode step failed");
  }
  const double with_logits = std::chrono::duration<double>(Clock::now() - t0).count() / 5;
  const double kv_bytes = double(batch) * (context + 1) * c.num_layers * c.kv_dim() * 2 * 2;
  const double weights = double((*runner)->WeightBytes());
  const double bound = (weights + kv_bytes) / kHbmBytesPerSecond;
  state.counters["tokens_per_second"] = batch / seconds;
  state.counters["weight_bytes"] = weights;
  state.counters["kv_bytes"] = kv_bytes;
  state.counters["bound_seconds"] = bound;
  state.counters["vs_bound"] = seconds / bound;
  state.counters["vs_d2d_bound"] = seconds / ((weights + kv_bytes) / (D2dBandwidth() / 2));
  state.counters["step_with_logits_copy_seconds"] = with_logits;
  int64_t device_weights = 0;
  for (const auto& [name, bytes] : (*runner)->DeviceWeightBytes()) device_weights += bytes;
  state.counters["device_weight_bytes"] = double(device_weights);
  state.counters["model_held_bytes"] = double(model->HeldBytes());
  for (SequenceKv& kv : seqs) (*cache)->Release(kv);
}

void BM_Decode1b(benchmark::State& state, int32_t batch, int32_t context) {
  if (SkipWithoutGpu(state)) return;
  RunDecode(state, Llama3_1b(), batch, context, {});
}

void BM_DecodeQ4KM(benchmark::State& state, int32_t batch, int32_t context, GpuWeights weights) {
  if (SkipWithoutGpu(state)) return;
  RunDecode(state, Llama32_1bQ4KM(), batch, context, {.gpu_weights = weights});
}

// The QuantGemv launches of one decode step at the llama3.2-1b shape, on device memory filled with
// a constant byte (0x11: every fp16 scale a small normal number; the values do not change the
// time). Each matrix has its own allocation slice, so nothing is reused from L2 across layers.
void BM_QuantGemvDecode(benchmark::State& state, cpu::QuantType type, cpu::QuantType cls_type,
                        int32_t batch) {
  if (SkipWithoutGpu(state)) return;
  const ModelConfig c = *NamedShape("llama3.2-1b");
  struct Mat {
    int64_t n, k;
    cpu::QuantType t;
    int64_t offset;
  };
  std::vector<Mat> mats;
  int64_t bytes = 0, total = 0;
  auto add = [&](int64_t n, int64_t k, cpu::QuantType t) {
    mats.push_back({n, k, t, total});
    bytes += n * cpu::QuantRowBytes(t, k);
    total += (n * cpu::QuantRowBytes(t, k) + 255) / 256 * 256;
  };
  for (int32_t l = 0; l < c.num_layers; ++l) {
    add(c.qkv_dim(), c.dim, type);
    add(c.dim, c.q_dim(), type);
    add(2 * int64_t(c.hidden_dim), c.dim, type);
    add(c.dim, c.hidden_dim, type);
  }
  add(c.vocab_size, c.dim, cls_type);
  uint8_t* w = nullptr;
  cuda::bf16* x = nullptr;
  float* y = nullptr;
  const int64_t kmax = std::max<int64_t>(c.dim, c.hidden_dim);
  if (!Check(state, cudaMalloc(&w, total)) ||
      !Check(state, cudaMalloc(&x, batch * kmax * sizeof(cuda::bf16))) ||
      !Check(state, cudaMalloc(&y, batch * int64_t(c.vocab_size) * sizeof(float))) ||
      !Check(state, cudaMemset(w, 0x11, total)) ||
      !Check(state, cudaMemset(x, 0x3c, batch * kmax * sizeof(cuda::bf16)))) {
    return;
  }
  auto step = [&] {
    for (const Mat& m : mats) {
      const cuda::QuantMatrixView v{w + m.offset, static_cast<cuda::QuantBlockType>(m.t), m.n,
                                    m.k, cpu::QuantRowBytes(m.t, m.k)};
      cuda::QuantGemv(v, x, y, batch, m.n, false, nullptr);
    }
  };
  double seconds = 0;
  for (auto _ : state) {
    seconds = TimeGpu(step, 10);
    state.SetIterationTime(seconds);
  }
  if (!Check(state, cudaGetLastError())) return;
  const double bw = double(bytes) / seconds;
  state.counters["weight_bytes"] = double(bytes);
  state.counters["weight_bytes_per_second"] = bw;
  state.counters["frac_of_4.8TBps"] = bw / kHbmBytesPerSecond;
  state.counters["frac_of_d2d"] = bw / D2dBandwidth();
  state.counters["launches"] = double(mats.size());
  for (void* p : {static_cast<void*>(w), static_cast<void*>(x), static_cast<void*>(y)}) {
    cudaFree(p);
  }
}

// Sequences of 4096 tokens fed in chunks of 256 through real GPU forward passes of a small model,
// all staying resident, until one fixed pool refuses the next chunk: full vs h2o at 20%.
int64_t Resident(const Model& model, int32_t pages, const std::string& policy) {
  constexpr int32_t kLen = 4096, kChunk = 256;
  auto cache = *CreateKvCache(Device::kCuda, KvShapeForDevice(Device::kCuda, model.config, 16), pages);
  auto runner = *MakeStepRunner(Device::kCuda, model, cache.get());
  auto pol = *MakePolicy(policy);
  std::vector<int32_t> tokens(kLen);
  for (int32_t i = 0; i < kLen; ++i) tokens[i] = i == 0 ? 1 : 3 + (i * 7) % 250;
  std::vector<std::unique_ptr<SequenceKv>> seqs;
  bool full_pool = false;
  while (!full_pool) {
    auto kv = std::make_unique<SequenceKv>();
    kv->policy = policy == "full" ? nullptr : pol.get();
    kv->budget = policy == "full" ? kUnboundedBudget : kLen / 5;
    for (int32_t pos = 0; pos < kLen && !full_pool; pos += kChunk) {
      SequenceStep step{kv.get(), std::span<const int32_t>(tokens).subspan(pos, kChunk), pos, false};
      absl::StatusOr<std::span<const float>> r = runner->Forward({&step, 1});
      if (!r.ok() && !absl::IsResourceExhausted(r.status())) return -1;
      full_pool = !r.ok();
    }
    if (full_pool) {
      cache->Release(*kv);
    } else {
      seqs.push_back(std::move(kv));
    }
  }
  for (auto& s : seqs) cache->Release(*s);
  return static_cast<int64_t>(seqs.size());
}

void BM_Capacity(benchmark::State& state) {
  if (SkipWithoutGpu(state)) return;
  ModelConfig c;
  c.dim = 128;
  c.hidden_dim = 256;
  c.num_layers = 2;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.vocab_size = 256;
  c.seq_len = 4096;
  std::filesystem::create_directories(ScratchDir());
  const std::string path = ScratchDir() + "/capacity-4096.bin";
  if (!WriteRandomModel(c, 5, path).ok()) return state.SkipWithError("cannot write the model");
  const Model model = *LoadModel(path);
  constexpr int32_t kPages = 2560;  // exactly 10 full-cache sequences of 4096 tokens
  int64_t full = 0, h2o = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    full = Resident(model, kPages, "full");
    h2o = Resident(model, kPages, "h2o");
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  if (full <= 0 || h2o < 0) return state.SkipWithError("forward pass failed");
  state.counters["full_sequences"] = full;
  state.counters["h2o_sequences"] = h2o;
  state.counters["ratio"] = double(h2o) / full;
  state.counters["pool_pages"] = kPages;
}

const bool registered = [] {
  benchmark::RegisterBenchmark("cuda/bandwidth/d2d", BM_D2d)->Iterations(1)->UseManualTime();
  const std::string att = "cuda/attention/decode/b64/ctx4096/q32kv8/hd128/";
  for (cuda::AttentionKernel kernel : {cuda::AttentionKernel::kMma, cuda::AttentionKernel::kStream,
                                        cuda::AttentionKernel::kTwoPass}) {
    const std::string name = absl::StrCat("/", cuda::AttentionKernelName(kernel));
    for (int32_t chunk : {0, 1024, 512}) {
      const std::string suffix = (chunk ? absl::StrCat("/chunk", chunk) : "") + name;
      for (bool scores : {false, true}) {
        benchmark::RegisterBenchmark((att + (scores ? "scores" : "noscores") + suffix).c_str(),
                                     BM_DecodeAttention, scores, chunk, kernel)
            ->Iterations(3)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  benchmark::RegisterBenchmark("cuda/decode/llama3-1b/b64/ctx1024", BM_Decode1b, 64, 1024)
      ->Iterations(20)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("cuda/decode/llama3-1b/b1/ctx1024", BM_Decode1b, 1, 1024)
      ->Iterations(20)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  using cpu::QuantType;
  struct Fmt {
    const char* name;
    QuantType matrices, classifier;
  };
  for (const Fmt& f : {Fmt{"q4_K+q6_K", QuantType::kQ4_K, QuantType::kQ6_K},
                       Fmt{"q4_0", QuantType::kQ4_0, QuantType::kQ4_0},
                       Fmt{"q8_0", QuantType::kQ8_0, QuantType::kQ8_0},
                       Fmt{"q5_K+q6_K", QuantType::kQ5_K, QuantType::kQ6_K},
                       Fmt{"q6_K", QuantType::kQ6_K, QuantType::kQ6_K}}) {
    for (int32_t batch : {1, 8}) {
      if (batch == 8 && f.matrices != QuantType::kQ4_K) continue;
      benchmark::RegisterBenchmark(
          absl::StrCat("cuda/quant_gemv/llama3.2-1b/b", batch, "/", f.name).c_str(),
          BM_QuantGemvDecode, f.matrices, f.classifier, batch)
          ->Iterations(3)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
  for (int32_t batch : {1, 64}) {  // b64: past kQuantGemvMaxTokens, the bf16-slab path
    for (GpuWeights weights : {GpuWeights::kBf16, GpuWeights::kQuantized}) {
      benchmark::RegisterBenchmark(absl::StrCat("cuda/decode/llama3.2-1b-q4_k_m/b", batch,
                                                "/ctx1024/", GpuWeightsName(weights))
                                       .c_str(),
                                   BM_DecodeQ4KM, batch, 1024, weights)
          ->Iterations(20)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  benchmark::RegisterBenchmark("cuda/capacity/len4096/h2o20-vs-full", BM_Capacity)
      ->Iterations(1)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  return true;
}();

}  // namespace
}  // namespace heavykv::bench
