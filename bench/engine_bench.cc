// The benchmarks of docs/BENCHMARKS.md. Each registers under a stable name that bench_main.cc
// reads back to form ratios between figures measured side by side in the same run.
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <omp.h>

// GCC 12 warns that _mm512_reduce_add_ps reads an uninitialised value: its own
// _mm256_undefined_pd() placeholder (GCC bug 105593), not ours.
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <algorithm>
#include <numeric>
#include <optional>
#include <random>
#include <chrono>
#include <cstring>
#include <functional>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_fixtures.h"
#include "kernels/aligned_vector.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/packed_gemm.h"
#include "kernels/cpu/paged_attention.h"

namespace heavykv::bench {
namespace {

constexpr int64_t kBandwidthBytes = int64_t(512) << 20;

// Copy rate of memcpy over every core: bytes copied per second.
void BM_MemcpyBandwidth(benchmark::State& state) {
  std::vector<char> src(kBandwidthBytes, 1), dst(kBandwidthBytes, 0);
  for (auto _ : state) {
#pragma omp parallel
    {
      const int64_t n = omp_get_num_threads(), i = omp_get_thread_num();
      const int64_t part = kBandwidthBytes / n;
      std::memcpy(dst.data() + i * part, src.data() + i * part, part);
    }
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(state.iterations() * kBandwidthBytes);
}

// Sum of n floats with 8 independent AVX-512 accumulators (one chain of adds, as a plain
// reduction compiles to on baseline x86-64, is bound by the add latency, not by memory: it
// measured 18.8 GB/s where this reads 28).
__attribute__((target("avx512f"))) float SumAvx512(const float* p, int64_t n) {
  __m512 acc[8];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 128 <= n; i += 128) {
    for (int j = 0; j < 8; ++j) acc[j] = _mm512_add_ps(acc[j], _mm512_loadu_ps(p + i + 16 * j));
  }
  for (int j = 1; j < 8; ++j) acc[0] = _mm512_add_ps(acc[0], acc[j]);
  float total = _mm512_reduce_add_ps(acc[0]);
  for (; i < n; ++i) total += p[i];
  return total;
}

// The same with 8 AVX2 accumulators, for CPUs without AVX-512.
__attribute__((target("avx2"))) float SumAvx2(const float* p, int64_t n) {
  __m256 acc[8];
  for (__m256& a : acc) a = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_add_ps(acc[j], _mm256_loadu_ps(p + i + 8 * j));
  }
  for (int j = 1; j < 8; ++j) acc[0] = _mm256_add_ps(acc[0], acc[j]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc[0]);
  float total = 0;
  for (float l : lanes) total += l;
  for (; i < n; ++i) total += p[i];
  return total;
}

// Read-only rate over every core: what a weight-streaming GEMV can at best reach.
void BM_ReadBandwidth(benchmark::State& state) {
  std::vector<float> src(kBandwidthBytes / sizeof(float), 1.0f);
  const cpu::Isa isa = cpu::BestIsa();
  for (auto _ : state) {
    float total = 0;
    if (isa != cpu::Isa::kPortable) {
#pragma omp parallel reduction(+ : total)
      {
        const int64_t n = int64_t(src.size()), t = omp_get_thread_num(), T = omp_get_num_threads();
        const int64_t begin = n * t / T, end = n * (t + 1) / T;
        total += isa == cpu::Isa::kAvx512 ? SumAvx512(src.data() + begin, end - begin)
                                          : SumAvx2(src.data() + begin, end - begin);
      }
    } else {
#pragma omp parallel for simd reduction(+ : total)
      for (int64_t i = 0; i < int64_t(src.size()); ++i) total += src[i];
    }
    benchmark::DoNotOptimize(total);
  }
  state.SetBytesProcessed(state.iterations() * kBandwidthBytes);
}

// `fmas` rounds over one 8 KiB page: each round, 16 rows of 8 vectors, one FMA per vector into
// the row's accumulator (the logits of one query head against 16 K rows of 128 dims).
template <int kFmas>
__attribute__((target("avx512f"), noinline)) float WalkPages(const float* base,
                                                             const int32_t* table, int32_t n) {
  __m512 acc[16], q[8];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  for (int k = 0; k < 8; ++k) q[k] = _mm512_set1_ps(0.5f + k);
  for (int32_t i = 0; i < n; ++i) {
    const float* page = base + int64_t(table[i]) * 2048;
    for (int f = 0; f < kFmas; ++f) {
      for (int r = 0; r < 16; ++r) {
        for (int k = 0; k < 8; ++k) {
          acc[r] = _mm512_fmadd_ps(q[k], _mm512_load_ps(page + r * 128 + k * 16), acc[r]);
        }
      }
    }
  }
  for (int r = 1; r < 16; ++r) acc[0] = _mm512_add_ps(acc[0], acc[r]);
  return _mm512_reduce_add_ps(acc[0]);
}

// The read rate of decode attention's access pattern without its softmax or bookkeeping: 8
// tasks (a batch-1 step's kv heads) each walk 4096 scattered 8 KiB pages (a kv head's 16 K rows
// of 128 fp32 on a page of a 256 MB pool on huge pages, in shuffled order), over the threads,
// with 1 FMA per vector read (what a group of 1 does) or 4 (a GQA group of 4, as
// attention/gqa8). What the attention kernel can hope for on this machine at that density.
template <int kFmas>
void BM_PagedWalk(benchmark::State& state) {
  if (cpu::BestIsa() != cpu::Isa::kAvx512) {
    state.SkipWithError("needs AVX-512");
    return;
  }
  constexpr int32_t kTasks = 8, kPages = 4096;
  AlignedVector<float> pool(int64_t(kTasks) * kPages * 2048, 0.01f);
  std::vector<int32_t> table(int64_t(kTasks) * kPages);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(7));
  float sink = 0;
  for (auto _ : state) {
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : sink)
    for (int32_t t = 0; t < kTasks; ++t) {
      sink += WalkPages<kFmas>(pool.data(), table.data() + int64_t(t) * kPages, kPages);
    }
  }
  benchmark::DoNotOptimize(sink);
  state.SetBytesProcessed(state.iterations() * int64_t(pool.size()) * 4);
}

// Multi-threaded BLAS sgemm on square matrices: the reference FLOP/s.
void BM_Sgemm(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  for (auto _ : state) {
    cpu::Sgemm(a.data(), b.data(), c.data(), n, n, n);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["flops"] = benchmark::Counter(2.0 * n * n * n * state.iterations(),
                                               benchmark::Counter::kIsRate);
}

// The GEMMs alone of a batch-32 decode step: every projection of every layer and the
// classifier of the stories110M model, weights streamed from memory as in a real step. What the
// step would cost if all else were free, through the engine's packed kernel and through OpenBLAS
// on row-major copies of the same matrices (the speed the engine had before its own kernel).
void BM_GemmDecodeShapes(benchmark::State& state, bool packed, cpu::WeightType weights) {
  const Model& model = Stories110M(weights);
  const ModelConfig& c = model.config;
  const int64_t m = state.range(0), hid = c.hidden_dim;
  std::vector<float> x(m * 2 * hid, 0.01f), y(m * std::max<int64_t>(c.vocab_size, 2 * hid));
  std::vector<const cpu::PackedMatrix*> mats;  // the runner's matrices are single packed parts
  for (const LayerWeights& w : model.layers) {
    for (const cpu::Linear* p : {&w.wqkv, &w.wo, &w.w13, &w.w2}) {
      mats.push_back(&std::get<cpu::PackedMatrix>(p->parts().front()));
    }
  }
  mats.push_back(&std::get<cpu::PackedMatrix>(model.classifier.parts().front()));
  std::vector<AlignedVector<float>> row_major;
  if (!packed) {
    for (const cpu::PackedMatrix* p : mats) {
      row_major.emplace_back(p->rows() * p->cols());
      p->ToRowMajor(row_major.back().data());
    }
  }
  for (auto _ : state) {
    for (size_t i = 0; i < mats.size(); ++i) {
      const cpu::PackedMatrix& w = *mats[i];
      if (packed) {
        cpu::MatmulPacked(x.data(), w, y.data(), m, w.rows(), false);
      } else {
        cpu::MatmulNT(x.data(), row_major[i].data(), y.data(), m, w.rows(), w.cols());
      }
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["flops"] = benchmark::Counter(
      state.iterations() * m * (DecodeFlopsPerToken(c, 0)), benchmark::Counter::kIsRate);
}

// The K/V storage a benchmark attends: fp32, bf16 (--kv-dtype bf16), int8 or int4 rows.
enum class BenchKv { kFp32, kBf16, kInt8, kInt4 };
KvQuant QuantOf(BenchKv kv) {
  return kv == BenchKv::kInt8 ? KvQuant::kInt8 : kv == BenchKv::kInt4 ? KvQuant::kInt4
                                                                      : KvQuant::kNone;
}
// Bytes of one K or V row of `hd` elements, scales included.
int64_t RowBytes(BenchKv kv, int32_t hd) {
  if (kv == BenchKv::kFp32) return int64_t(hd) * 4;
  if (kv == BenchKv::kBf16) return int64_t(hd) * 2;
  return KvQuantDataBytes(QuantOf(kv), hd) + KvQuantScaleBytes(QuantOf(kv), hd);
}
const char* KvSuffix(BenchKv kv) {
  return kv == BenchKv::kBf16 ? "/bf16kv" : kv == BenchKv::kInt8 ? "/int8kv"
                                          : kv == BenchKv::kInt4 ? "/int4kv" : "";
}

// Decode attention alone: `tasks` (sequence, kv head)s with a group of `group` query heads of
// `hd` dims each, `context` K/V slots each in `kv`'s storage, over every core as the runner
// schedules them, through `isa`'s path (nullopt: PagedAttention's best), with or without the H2O
// score add; the page table in order or shuffled as a pool hands pages out. Run() attends once.
struct AttentionWorkload {
  AttentionWorkload(int32_t tasks, int32_t group, int32_t hd, int32_t context, BenchKv kv_kind,
                    bool scores, std::optional<cpu::Isa> isa, bool shuffled, int32_t num_q)
      : tasks(tasks), group(group), hd(hd), context(context), kv_kind(kv_kind), scores(scores),
        isa(isa), num_q(num_q) {
    const bool bf16 = kv_kind == BenchKv::kBf16;
    const KvQuant quant = QuantOf(kv_kind);
    pages_per_task = (context + num_q + kBs - 1) / kBs;  // the new tokens' included
    page_elems = int64_t(kBs) * hd;
    const int64_t pages = int64_t(tasks) * pages_per_task;
    // Quantized pages as KvCache lays them out: [K data][V data][K scales][V scales].
    qrow = quant != KvQuant::kNone ? KvQuantDataBytes(quant, hd) : 0;
    qscale = quant != KvQuant::kNone ? KvQuantScaleBytes(quant, hd) : 0;
    qpage = 2 * int64_t(kBs) * (qrow + qscale);
    if (quant != KvQuant::kNone) {
      kvq = AlignedVector<uint8_t>(pages * qpage, 0);
      std::vector<float> row(hd);
      std::mt19937 rng(5);
      std::normal_distribution<float> normal(0.0f, 0.5f);
      for (int64_t p = 0; p < pages; ++p) {
        uint8_t* base = kvq.data() + p * qpage;
        for (int32_t r = 0; r < 2 * kBs; ++r) {  // K rows, then V rows
          for (float& x : row) x = normal(rng);
          QuantizeKvRow(quant, row.data(), hd, base + int64_t(r) * qrow,
                        base + 2 * int64_t(kBs) * qrow + int64_t(r) * qscale);
        }
      }
    } else if (bf16) {
      k16 = AlignedVector<uint16_t>(pages * page_elems, 0x3c00);
      v16 = AlignedVector<uint16_t>(pages * page_elems, 0x3c00);
    } else {
      k32 = AlignedVector<float>(pages * page_elems, 0.01f);
      v32 = AlignedVector<float>(pages * page_elems, 0.01f);
    }
    table.resize(pages);
    pos.resize(pages * kBs);
    std::iota(table.begin(), table.end(), 0);
    if (shuffled) std::shuffle(table.begin(), table.end(), std::mt19937(7));
    const int64_t q_floats = int64_t(tasks) * num_q * group * hd;
    score.assign(pages * kBs, 0.0f);
    q.assign(q_floats, 0.02f);
    out.resize(q_floats);
  }

  void Run() {
    const bool bf16 = kv_kind == BenchKv::kBf16;
    const KvQuant quant = QuantOf(kv_kind);
#pragma omp parallel
    {
      std::vector<float> scratch(cpu::AttentionScratchFloats(context + num_q, group, num_q));
#pragma omp for schedule(dynamic, 1)
      for (int32_t t = 0; t < tasks; ++t) {
        cpu::AttentionArgs a;
        a.kv.pages = table.data() + int64_t(t) * pages_per_task;
        a.kv.num_slots = context + num_q;
        a.kv.block_size = kBs;
        a.kv.head_dim = hd;
        if (quant != KvQuant::kNone) {
          a.kv.quant = quant;
          a.kv.row_bytes = qrow;
          a.kv.scale_bytes = qscale;
          a.kv.kq = kvq.data();
          a.kv.vq = kvq.data() + int64_t(kBs) * qrow;
          a.kv.ksc = kvq.data() + 2 * int64_t(kBs) * qrow;
          a.kv.vsc = a.kv.ksc + int64_t(kBs) * qscale;
          a.kv.page_stride = qpage;
        } else {
          a.kv.k = bf16 ? nullptr : k32.data();
          a.kv.v = bf16 ? nullptr : v32.data();
          a.kv.k16 = bf16 ? k16.data() : nullptr;
          a.kv.v16 = bf16 ? v16.data() : nullptr;
          a.kv.page_stride = page_elems;
        }
        a.kv.pos = pos.data();
        a.kv.score = score.data();
        a.kv.meta_page_stride = kBs;
        a.num_old = context;
        a.num_q = num_q;
        a.group = group;
        a.q = q.data() + int64_t(t) * num_q * group * hd;
        a.q_stride = int64_t(group) * hd;
        a.out = out.data() + int64_t(t) * num_q * group * hd;
        a.out_stride = int64_t(group) * hd;
        a.channel.kind = scores ? SlotChannel::kAccumulated : SlotChannel::kNone;
        if (isa.has_value()) {
          cpu::PagedAttentionWith(*isa, a, scratch.data());
        } else {
          cpu::PagedAttention(a, scratch.data());
        }
      }
    }
  }

  static constexpr int32_t kBs = 16;
  int32_t tasks, group, hd, context;
  BenchKv kv_kind;
  bool scores;
  std::optional<cpu::Isa> isa;
  int32_t num_q;
  int32_t pages_per_task = 0, qrow = 0, qscale = 0;
  int64_t page_elems = 0, qpage = 0;
  AlignedVector<float> k32, v32;
  AlignedVector<uint16_t> k16, v16;
  AlignedVector<uint8_t> kvq;
  std::vector<int32_t> table, pos;
  std::vector<float> score, q, out;
};

// The workload timed. Bytes: the K and V rows read (with their scales).
void RunAttention(benchmark::State& state, int32_t tasks, int32_t group, int32_t hd,
                  int32_t context, BenchKv kv_kind, bool scores, std::optional<cpu::Isa> isa,
                  bool shuffled, int32_t num_q = 1) {
  AttentionWorkload w(tasks, group, hd, context, kv_kind, scores, isa, shuffled, num_q);
  w.Run();
  for (auto _ : state) {
    w.Run();
    benchmark::DoNotOptimize(w.out.data());
  }
  if (num_q == 1) {
    state.SetBytesProcessed(state.iterations() * int64_t(tasks) * (context + 1) * 2 *
                            RowBytes(kv_kind, hd));
    // Tokens of context attended per second, per (sequence, kv head): what a decode step's
    // attention costs at this context.
    state.counters["ctx_tokens_per_second"] = benchmark::Counter(
        double(state.iterations()) * tasks * (context + 1), benchmark::Counter::kIsRate);
  } else {
    state.counters["queries"] =  // query tokens of one sequence (tasks are its kv heads)
        benchmark::Counter(double(state.iterations()) * num_q, benchmark::Counter::kIsRate);
  }
}

// Through one ISA's path: 768 (sequence, kv head)s at the stories110M head (64 dims, group 1;
// one layer of a batch of 64, 200 MB at context 512 in fp32, so it streams from memory as in a
// step).
void BM_Attention(benchmark::State& state, cpu::Isa isa, int32_t context, BenchKv kv,
                  bool scores) {
  RunAttention(state, 768, 1, 64, context, kv, scores, isa, /*shuffled=*/false);
}

// At long contexts (issue 18): `batch` sequences of one Llama 3 8B layer (8 kv heads, 4 query
// heads each, head_dim 128), pages shuffled.
void BM_AttentionLong(benchmark::State& state, int32_t batch, int32_t context, BenchKv kv,
                      std::optional<cpu::Isa> isa) {
  RunAttention(state, batch * 8, 4, 128, context, kv, /*scores=*/false, isa,
               /*shuffled=*/true);
}

// Times `a` and `b` once each per iteration in ABBA order (a first on even iterations), so that a
// slow minute of a shared machine falls on both, and sets the counters: ratio (the median over
// iterations of a's time over b's: robust to a step stalled by another tenant), ratio_of_sums,
// and <a_ms>, <b_ms> (mean milliseconds).
void InterleavedRatio(benchmark::State& state, const std::function<void()>& a,
                      const std::function<void()>& b, const char* a_ms, const char* b_ms) {
  auto timed = [](const std::function<void()>& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<double> ratios;
  double sum_a = 0, sum_b = 0;
  for (auto _ : state) {
    double ta, tb;
    if (ratios.size() % 2 == 0) {
      ta = timed(a);
      tb = timed(b);
    } else {
      tb = timed(b);
      ta = timed(a);
    }
    sum_a += ta;
    sum_b += tb;
    ratios.push_back(ta / tb);
  }
  std::sort(ratios.begin(), ratios.end());
  const size_t n = ratios.size();
  state.counters["ratio"] = n % 2 ? ratios[n / 2] : 0.5 * (ratios[n / 2 - 1] + ratios[n / 2]);
  state.counters["ratio_of_sums"] = sum_a / sum_b;
  state.counters[a_ms] = 1e3 * sum_a / n;
  state.counters[b_ms] = 1e3 * sum_b / n;
}

// Issue 29: batch-1 decode attention at a long context (one Llama 3 8B layer: 8 kv heads, GQA
// 4, head_dim 128, pages shuffled) over `kv` K/V against bf16 K/V, timed interleaved
// (InterleavedRatio): ratio = bf16's time over kv's = kv's tokens/s over bf16's.
void BM_AttentionKvVsBf16(benchmark::State& state, int32_t context, BenchKv kv) {
  AttentionWorkload bf16(8, 4, 128, context, BenchKv::kBf16, false, std::nullopt, true, 1);
  AttentionWorkload other(8, 4, 128, context, kv, false, std::nullopt, true, 1);
  bf16.Run();
  other.Run();
  InterleavedRatio(state, [&] { bf16.Run(); }, [&] { other.Run(); }, "bf16_ms", "kv_ms");
}

// A line "<key>: <n> kB" of /proc/self/status, in MB (-1 when missing).
double ProcStatusMb(const std::string& key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + ":", 0) == 0) return std::atof(line.c_str() + key.size() + 1) / 1024.0;
  }
  return -1;
}

// The resident memory of a long prefill (issue 18: a 32k-token prompt peaks at its K/V plus
// O(chunk x context) scratch, never a context x context matrix): a one-layer model (8 query and
// 2 kv heads of 64), a pool of exactly the sequence's pages (allocated, and so touched, before),
// the prompt in chunks of 512. Counters, in MB: kv_pool (the pool), growth (the peak resident set
// during the prefill over the resident set before it: every allocation the prefill makes),
// scratch (the threads' attention scratch: one tile of probabilities over the context each),
// activations (one chunk's rows of the runner's buffers), one_matrix (one head's context x
// context fp32 matrix, which a non-tiled prefill would hold).
void BM_PrefillPeakMemory(benchmark::State& state, int32_t tokens) {
  constexpr int32_t kChunk = 512;
  ModelConfig c;
  c.dim = 512;
  c.hidden_dim = 1024;
  c.num_layers = 1;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.vocab_size = 256;
  c.seq_len = tokens + 16;
  const Model model = SmallModel(c, absl::StrCat("prefill-memory-", c.seq_len, ".bin"), 3);
  const KvShape shape = KvShapeFor(model.config, 16);
  const int64_t pages = PeakPages(shape, nullptr, kUnboundedBudget, tokens);
  std::unique_ptr<KvCache> cache = *KvCache::Create(shape, static_cast<int32_t>(pages));
  ModelRunner runner(model, cache.get());
  std::vector<int32_t> prompt(tokens);
  for (int32_t i = 0; i < tokens; ++i) prompt[i] = 1 + (i * 31) % (c.vocab_size - 1);
  double growth = 0;
  for (auto _ : state) {
    // Reset the peak resident set (VmHWM) to the current one: "5" to clear_refs (Linux 4.0+).
    if (std::ofstream clear("/proc/self/clear_refs"); !(clear << "5" << std::flush)) {
      state.SkipWithError("cannot reset VmHWM through /proc/self/clear_refs");
      return;
    }
    const double before = ProcStatusMb("VmRSS");
    SequenceKv kv;
    Prefill(runner, kv, prompt, kChunk);
    growth = ProcStatusMb("VmHWM") - before;
    cache->Release(kv);
  }
  const int32_t G = c.num_heads / c.num_kv_heads;
  const double mb = 1.0 / (1 << 20);
  state.counters["kv_pool"] = double(pages) * shape.PageFloats() * 4 * mb;
  state.counters["growth"] = growth;
  state.counters["scratch"] =
      omp_get_max_threads() * cpu::AttentionScratchFloats(tokens, G, kChunk) * 4 * mb;
  state.counters["activations"] =
      double(kChunk) * (3 * c.dim + c.dim + 2 * c.kv_dim() + 3 * c.hidden_dim) * 4 * mb;
  state.counters["one_matrix"] = double(tokens) * tokens * 4 * mb;
  state.counters["tokens"] =
      benchmark::Counter(double(state.iterations()) * tokens, benchmark::Counter::kIsRate);
}

// Split-K decode attention (issue 18): one sequence of a model with a single kv head (4 query
// heads of 128, 2 layers, 8 MB of weights) at `context` cached tokens, so that a step has one
// (sequence, kv head) pair per layer for the threads: each iteration times a step with the
// context cut into parts across the threads and one without (one thread attends, the others
// wait), interleaved (InterleavedRatio: ratio is split / unsplit).
void BM_SplitAttention(benchmark::State& state, int32_t context) {
  ModelConfig c;
  c.dim = 512;
  c.hidden_dim = 256;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 1;
  c.vocab_size = 256;
  c.seq_len = context + 256;
  const Model model = SmallModel(c, absl::StrCat("mqa-", c.seq_len, ".bin"), 4);
  std::unique_ptr<Batch> b = MakeBatch(model, 1, context, "full", kUnboundedBudget);
  ModelRunner split(model, b->cache.get()), unsplit(model, b->cache.get());
  unsplit.set_split_attention(false);
  DecodeStep(split, *b, context);  // warm-up
  DecodeStep(unsplit, *b, context);
  InterleavedRatio(
      state, [&] { DecodeStep(split, *b, context); }, [&] { DecodeStep(unsplit, *b, context); },
      "split_ms", "unsplit_ms");
  const double n = state.iterations();
  state.counters["parts"] = double(split.split_attention_parts()) / (n + 1) / c.num_layers;
}

// A prefill chunk's attention (issue 18): `num_q` new tokens after `context` cached ones, one
// llama3.2-1b layer (8 kv heads, 4 query heads each, head_dim 64), the H2O scores accumulated;
// counter: query tokens/s.
void BM_AttentionPrefill(benchmark::State& state, int32_t context, int32_t num_q,
                         std::optional<cpu::Isa> isa) {
  RunAttention(state, 8, 4, 64, context, BenchKv::kFp32, /*scores=*/true, isa, /*shuffled=*/true,
               num_q);
}

// One decode step of `batch` sequences at `context` cached tokens, on the stories110M shape.
void BM_Decode(benchmark::State& state, int32_t batch, int32_t context, std::string policy,
               int32_t budget, int32_t kv_element_bytes, cpu::WeightType weights) {
  const Model& model = Stories110M(weights);
  std::unique_ptr<Batch> b = MakeBatch(model, batch, context, policy, budget, kv_element_bytes);
  ModelRunner runner(model, b->cache.get());
  const int32_t held = std::min(context, budget);
  DecodeStep(runner, *b, context);  // warm-up: first touch of buffers
  for (auto _ : state) DecodeStep(runner, *b, context);
  const double steps = state.iterations();
  state.counters["tokens"] = benchmark::Counter(steps * batch, benchmark::Counter::kIsRate);
  state.counters["flops"] = benchmark::Counter(
      steps * batch * DecodeFlopsPerToken(model.config, held), benchmark::Counter::kIsRate);
  state.counters["weight_bytes"] =
      benchmark::Counter(steps * model.WeightBytes(), benchmark::Counter::kIsRate);
  state.counters["kv_bytes"] = benchmark::Counter(
      steps * batch * KvBytesPerToken(model.config, held) * kv_element_bytes / 4,
      benchmark::Counter::kIsRate);
  state.counters["pages"] = b->cache->allocator().num_pages_used();
}

// The policy/baseline step-time ratio with the two steps interleaved: each iteration times one
// step of the baseline (`full`, or `baseline` at the same budget) and one step of `policy` (at
// budget `budget`, evicting every step at token granularity, every 16th at page granularity) of
// `batch` sequences at `context`, in alternating order (ABBA), so that a slow minute of a shared
// machine falls on both. Counters: the median over iterations of policy/baseline (`ratio`, what
// the target reads; robust to a step stalled by another tenant) and the ratio of the summed
// times (`ratio_of_sums`: the one to read at page granularity, whose steps differ within a
// cycle of 16); `full_ms` is the baseline's step time, `h2o_ms` the policy's, whatever they are.
void BM_DecodePolicyVsFull(benchmark::State& state, int32_t batch, int32_t context,
                           std::string policy, int32_t budget, std::string baseline,
                           bool baseline_one_table) {
  const Model& model = Stories110M();
  std::unique_ptr<Batch> full =
      MakeBatch(model, batch, context, baseline, baseline == "full" ? kUnboundedBudget : budget,
                4, /*table_per_layer=*/!baseline_one_table);
  std::unique_ptr<Batch> h2o = MakeBatch(model, batch, context, policy, budget);
  ModelRunner full_runner(model, full->cache.get()), h2o_runner(model, h2o->cache.get());
  DecodeStep(full_runner, *full, context);  // warm-up: first touch of buffers
  DecodeStep(h2o_runner, *h2o, context);
  InterleavedRatio(
      state, [&] { DecodeStep(h2o_runner, *h2o, context); },
      [&] { DecodeStep(full_runner, *full, context); }, "h2o_ms", "full_ms");
}

void BM_DecodePolicyVsBaseline(benchmark::State& state, int32_t batch, int32_t context,
                               std::string policy, int32_t budget, std::string baseline) {
  BM_DecodePolicyVsFull(state, batch, context, policy, budget, baseline, false);
}

// The same policy with a block table per layer against one table for all layers.
void BM_DecodeTablePerLayer(benchmark::State& state, int32_t batch, int32_t context,
                            std::string policy, int32_t budget) {
  BM_DecodePolicyVsFull(state, batch, context, policy, budget, policy, true);
}

// The eviction part of a decode step alone, page against token granularity, interleaved (ABBA):
// `batch` sequences of the stories110M shape (12 layers x 12 kv heads) at budget 512, each step
// appends one slot (position and channel; the attention's K/V and score writes are the same work
// in both and left out) to every (layer, head) and calls EvictHead on each over every core, as
// the runner does, then Commit. Token granularity evicts one token per head every step; page
// granularity sixteen once per 16 steps. Iterations are whole cycles of 16; `ratio_of_sums` is
// page/token, `token_us` and `page_us` the mean per step.
void BM_EvictPageVsToken(benchmark::State& state, int32_t batch) {
  const Model& model = Stories110M();
  constexpr int32_t kContext = 512, kBudget = 512;
  std::unique_ptr<Batch> token = MakeBatch(model, batch, kContext, "h2o", kBudget);
  std::unique_ptr<Batch> page = MakeBatch(model, batch, kContext, "h2o:granularity=page", kBudget);
  const KvShape& shape = token->cache->shape();
  const int32_t heads = shape.num_layers * shape.num_kv_heads;
  auto step = [&](Batch& b) {
    for (SequenceKv& s : b.seqs) {
      if (absl::Status st = b.cache->Reserve(s, 1); !st.ok()) Die(st);
    }
    const int32_t pos = b.next_pos++;
#pragma omp parallel for schedule(dynamic, 4)
    for (int64_t task = 0; task < int64_t(b.seqs.size()) * heads; ++task) {
      SequenceKv& s = b.seqs[task / heads];
      const int32_t l = static_cast<int32_t>(task % heads) / shape.num_kv_heads;
      const int32_t h = static_cast<int32_t>(task % heads) % shape.num_kv_heads;
      const int32_t old = s.Slots(l);
      PagedKvHead v = b.cache->View(s, l, h, old + 1);
      v.Pos(old) = pos;
      v.Score(old) = static_cast<float>((pos * 31 + task * 7) % 97) * 0.01f;
      b.cache->EvictHead(s, l, h, old + 1, pos);
    }
    for (SequenceKv& s : b.seqs) b.cache->CommitStep(s, 1);
  };
  auto timed = [&](Batch& b) {
    const auto t0 = std::chrono::steady_clock::now();
    step(b);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (int i = 0; i < 16; ++i) {  // warm-up: one whole cycle each
    step(*token);
    step(*page);
  }
  double sum_token = 0, sum_page = 0;
  int64_t n = 0;
  for (auto _ : state) {
    if (n++ % 2 == 0) {
      sum_token += timed(*token);
      sum_page += timed(*page);
    } else {
      sum_page += timed(*page);
      sum_token += timed(*token);
    }
  }
  state.counters["ratio_of_sums"] = sum_page / sum_token;
  state.counters["token_us"] = 1e6 * sum_token / n;
  state.counters["page_us"] = 1e6 * sum_page / n;
}

// How many sequences of 1024 tokens one fixed pool holds at once, with real forward passes of
// a small model: sequences are admitted one after another and each fed its 1024 tokens in
// chunks of 16, all staying resident, until the pool refuses the next chunk. The pool has the
// bytes of 640 fp32 pages (of one layer, pos and score included): 640 pages of fp32 K/V, or as
// many bf16, int8 or int4 pages as those bytes make (KvCache::PagesForBytes). `request`: every
// sequence's own row type (a request's kv_dtype: packed pages of the pool, SequenceKv::quant).
void BM_Capacity(benchmark::State& state, std::string policy, BenchKv kv, KvQuant request) {
  ModelConfig c;
  c.dim = 64;
  c.hidden_dim = 128;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.vocab_size = 256;
  c.seq_len = 1024;
  static const Model* model = new Model(SmallModel(c, "capacity-small.bin", 5));
  // Exactly 10 full-cache fp32 sequences of 1024 tokens (pages of one layer); the same bytes of
  // pages of the other storages.
  const KvShape fp32_shape = KvShapeFor(model->config, 16);
  const int64_t pool_bytes = int64_t(640) * model->config.num_layers * fp32_shape.PageBytes();
  constexpr int32_t kLen = 1024, kChunk = 16;
  const int32_t budget = policy == "full" ? kUnboundedBudget : kLen / 5;  // 20%
  int64_t resident = 0;
  int32_t pages = 0;
  for (auto _ : state) {
    KvShape shape = fp32_shape;
    shape.element_bytes = kv == BenchKv::kBf16 ? 2 : 4;
    shape.quant = QuantOf(kv);
    pages = KvCache::PagesForBytes(shape, pool_bytes);
    auto cache = *KvCache::Create(shape, pages);
    ModelRunner runner(*model, cache.get());
    auto pol = *MakePolicy(policy);
    std::vector<std::unique_ptr<SequenceKv>> seqs;
    std::vector<int32_t> tokens(kLen);
    for (int32_t i = 0; i < kLen; ++i) tokens[i] = i == 0 ? 1 : 3 + (i * 7) % 250;
    bool full_pool = false;
    while (!full_pool) {
      auto kv = std::make_unique<SequenceKv>();
      kv->policy = policy == "full" ? nullptr : pol.get();
      kv->budget = budget;
      kv->quant = request;
      for (int32_t pos = 0; pos < kLen && !full_pool; pos += kChunk) {
        SequenceStep step{kv.get(), std::span<const int32_t>(tokens).subspan(pos, kChunk), pos,
                          false};
        full_pool = !runner.Forward({&step, 1}).ok();
      }
      if (full_pool) {
        cache->Release(*kv);
      } else {
        seqs.push_back(std::move(kv));
      }
    }
    resident = seqs.size();
    state.counters["pages_per_seq"] = seqs.empty() ? 0.0 : double(seqs[0]->NumPages());
    for (auto& s : seqs) cache->Release(*s);
  }
  state.counters["sequences"] = double(resident);
  state.counters["pool_pages"] = pages;
}

void Register() {  // NOLINT: one list, in report order
  // Long-context decode attention, GQA 8:1 (issue 18): compare bytes_per_second with
  // bandwidth/read.
  // int8 and int4 K/V (issue 29) at 16k and 32k.
  for (int32_t batch : {1, 8}) {
    for (int32_t context : {1024, 4096, 8192, 16384, 32768}) {
      for (BenchKv kv : {BenchKv::kFp32, BenchKv::kBf16, BenchKv::kInt8, BenchKv::kInt4}) {
        if (QuantOf(kv) != KvQuant::kNone && context < 16384) continue;
        benchmark::RegisterBenchmark(
            absl::StrCat("attention/gqa8/b", batch, "/ctx", context, KvSuffix(kv)).c_str(),
            BM_AttentionLong, batch, context, kv, std::nullopt)
            ->MinTime(0.5)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
  for (int32_t context : {16384, 32768}) {
    for (BenchKv kv : {BenchKv::kInt8, BenchKv::kInt4}) {
      benchmark::RegisterBenchmark(
          absl::StrCat("attention/gqa8/b1/ctx", context, KvSuffix(kv), "-vs-bf16kv").c_str(),
          BM_AttentionKvVsBf16, context, kv)
          ->MinTime(2.0)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  benchmark::RegisterBenchmark("bandwidth/memcpy", BM_MemcpyBandwidth)->MinTime(0.5)->UseRealTime();
  benchmark::RegisterBenchmark("bandwidth/read", BM_ReadBandwidth)->MinTime(0.5)->UseRealTime();
  benchmark::RegisterBenchmark("bandwidth/paged-walk/fma1", BM_PagedWalk<1>)
      ->MinTime(0.5)
      ->UseRealTime();
  benchmark::RegisterBenchmark("bandwidth/paged-walk/fma4", BM_PagedWalk<4>)
      ->MinTime(0.5)
      ->UseRealTime();
  benchmark::RegisterBenchmark("sgemm/1024", BM_Sgemm)->Arg(1024)->MinTime(0.5)->UseRealTime();
  for (bool packed : {true, false}) {
    benchmark::RegisterBenchmark(packed ? "gemm/decode-shapes-b32/packed"
                                        : "gemm/decode-shapes-b32/openblas",
                                 BM_GemmDecodeShapes, packed, cpu::WeightType::kFp32)
        ->Arg(32)
        ->MinTime(1.0)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("gemm/decode-shapes-b32/packed-bf16", BM_GemmDecodeShapes, true,
                               cpu::WeightType::kBf16)
      ->Arg(32)
      ->MinTime(1.0)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  // The last 512-token chunk of a 4096-token prompt, through the best path and the AVX2 one.
  for (cpu::Isa isa : cpu::SupportedIsas()) {
    if (isa == cpu::Isa::kPortable) continue;
    benchmark::RegisterBenchmark(
        absl::StrCat("attention/prefill/chunk512/ctx3584/", cpu::IsaName(isa)).c_str(),
        BM_AttentionPrefill, 3584, 512, isa)
        ->MinTime(0.5)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  // The AVX2 path at the same shapes, where the CPU has AVX-512 too (else the cases above are it).
  for (cpu::Isa isa : cpu::SupportedIsas()) {
    if (isa != cpu::Isa::kAvx2 || cpu::BestIsa() == cpu::Isa::kAvx2) continue;
    for (int32_t context : {4096, 32768}) {
      benchmark::RegisterBenchmark(absl::StrCat("attention/gqa8/b1/ctx", context, "/avx2").c_str(),
                                   BM_AttentionLong, 1, context, BenchKv::kFp32, isa)
          ->MinTime(0.5)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (cpu::Isa isa : cpu::SupportedIsas()) {  // the others are not listed on this CPU
    for (BenchKv kv : {BenchKv::kFp32, BenchKv::kBf16, BenchKv::kInt8, BenchKv::kInt4}) {
      for (bool scores : {false, true}) {
        benchmark::RegisterBenchmark(
            absl::StrCat("attention/ctx512/", cpu::IsaName(isa), KvSuffix(kv),
                         scores ? "/scores" : "").c_str(),
            BM_Attention, isa, 512, kv, scores)
            ->MinTime(0.5)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
  struct D {
    int32_t batch, context;
    const char* policy;
    int32_t budget;
    int32_t kv_bytes = 4;  // 2: bf16 KV (--kv-dtype bf16), named .../bf16kv
    bool bf16_weights = false;  // --weight-dtype bf16, named .../bf16w
  };
  const D decodes[] = {
      {1, 64, "full", kUnboundedBudget},  {32, 64, "full", kUnboundedBudget},
      {32, 64, "full", kUnboundedBudget, 2},
      {1, 64, "full", kUnboundedBudget, 4, true},  {32, 64, "full", kUnboundedBudget, 4, true},
      {32, 64, "full", kUnboundedBudget, 2, true},
      {1, 512, "full", kUnboundedBudget}, {1, 512, "h2o", 512},
      {32, 512, "full", kUnboundedBudget}, {32, 512, "h2o", 512},
      {32, 512, "full", kUnboundedBudget, 2}, {32, 512, "h2o", 512, 2},
      // The policy zoo beside h2o (issue 17: each within 1.10x of full).
      {32, 512, "tova", 512}, {32, 512, "scissorhands", 512}, {32, 512, "knorm", 512},
      {32, 512, "snapkv", 512},
      {1, 4096, "full", kUnboundedBudget}, {1, 4096, "h2o", 819},
  };
  for (const D& d : decodes) {
    std::string name = absl::StrCat("decode/b", d.batch, "/ctx", d.context, "/", d.policy);
    if (d.budget != kUnboundedBudget) absl::StrAppend(&name, d.budget);
    if (d.bf16_weights) absl::StrAppend(&name, "/bf16w");
    if (d.kv_bytes == 2) absl::StrAppend(&name, "/bf16kv");
    benchmark::RegisterBenchmark(
        name.c_str(), BM_Decode, d.batch, d.context, std::string(d.policy), d.budget, d.kv_bytes,
        d.bf16_weights ? cpu::WeightType::kBf16 : cpu::WeightType::kFp32)
        ->MinTime(1.0)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (int32_t batch : {1, 32}) {
    for (const char* p : {"h2o", "tova", "scissorhands", "knorm", "snapkv"}) {
      if (batch == 1 && std::string(p) != "h2o") continue;
      benchmark::RegisterBenchmark(
          absl::StrCat("decode/b", batch, "/ctx512/", p, "512-vs-full").c_str(),
          BM_DecodePolicyVsBaseline, batch, 512, std::string(p), 512, std::string("full"))
          ->Iterations(batch == 1 ? 40 : 12)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (int32_t context : {4096, 32768}) {
    benchmark::RegisterBenchmark(
        absl::StrCat("decode/kv1/b1/ctx", context, "/split-vs-unsplit").c_str(),
        BM_SplitAttention, context)
        ->Iterations(40)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("prefill/ctx32768/peak-memory", BM_PrefillPeakMemory, 32768)
      ->Iterations(1)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  // h2o at a 20% budget against full at 4096 cached tokens (issue 18: <= 0.5x). At batch 1 the
  // weights (440 MB) are most of a step's bytes, so the byte count bounds the ratio at 0.67;
  // at batch 8 the K/V (2.4 GB) dominate and the bound is 0.32.
  for (int32_t batch : {1, 8}) {
    benchmark::RegisterBenchmark(absl::StrCat("decode/b", batch, "/ctx4096/h2o819-vs-full").c_str(),
                                 BM_DecodePolicyVsBaseline, batch, 4096, std::string("h2o"), 819,
                                 std::string("full"))
        ->Iterations(batch == 1 ? 40 : 12)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  // Page against token granularity on the h2o step (issue 17): 48 steps, three whole cycles of
  // one page eviction per 16 steps; read ratio_of_sums.
  for (int32_t batch : {1, 32}) {
    benchmark::RegisterBenchmark(
        absl::StrCat("decode/b", batch, "/ctx512/h2o512-page-vs-token").c_str(),
        BM_DecodePolicyVsBaseline, batch, 512, std::string("h2o:granularity=page"), 512,
        std::string("h2o"))
        ->Iterations(batch == 1 ? 160 : 48)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (int32_t batch : {1, 32}) {
    benchmark::RegisterBenchmark(absl::StrCat("evict/b", batch, "/h2o512-page-vs-token").c_str(),
                                 BM_EvictPageVsToken, batch)
        ->Iterations(batch == 1 ? 1600 : 320)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
  benchmark::RegisterBenchmark("decode/b32/ctx512/h2o512-page-vs-full", BM_DecodePolicyVsBaseline,
                               32, 512, std::string("h2o:granularity=page"), 512,
                               std::string("full"))
      ->Iterations(48)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  // The host's block table per layer against one table for all layers (the layout before layer
  // budgets, and CUDA's), the same policy: what the per-layer tables cost a decode step.
  for (int32_t batch : {1, 32}) {
    for (const char* p : {"full", "h2o"}) {
      benchmark::RegisterBenchmark(
          absl::StrCat("decode/b", batch, "/ctx512/", p, "-table-per-layer-vs-one").c_str(),
          BM_DecodeTablePerLayer, batch, 512, std::string(p),
          std::string(p) == "full" ? kUnboundedBudget : 256)
          ->Iterations(batch == 1 ? 40 : 12)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  // Layer budgets against uniform h2o with the same total (issue 17): the step (a half-context
  // budget, so pyramid's first layers stay within the context) and the sequences the pool holds.
  // Not squeeze's step: its layers get their budgets on the first step and the larger ones then
  // grow a token per step, so a short run would time a cache below its steady state.
  benchmark::RegisterBenchmark("decode/b32/ctx512/h2o:layers=pyramid-vs-uniform-h2o256",
                               BM_DecodePolicyVsBaseline, 32, 512,
                               std::string("h2o:layers=pyramid"), 256, std::string("h2o"))
      ->Iterations(12)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  for (const char* p : {"h2o:layers=pyramid", "h2o:layers=squeeze"}) {
    benchmark::RegisterBenchmark(absl::StrCat("capacity/len1024/", p).c_str(), BM_Capacity,
                                 std::string(p), BenchKv::kFp32, KvQuant::kNone)
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  }
  for (const char* p : {"tova", "scissorhands", "knorm", "snapkv"}) {
    benchmark::RegisterBenchmark(absl::StrCat("capacity/len1024/", p).c_str(), BM_Capacity,
                                 std::string(p), BenchKv::kFp32, KvQuant::kNone)
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("capacity/len1024/h2o:granularity=page", BM_Capacity,
                               std::string("h2o:granularity=page"), BenchKv::kFp32,
                               KvQuant::kNone)
      ->Iterations(1)
      ->Unit(benchmark::kMillisecond);
  for (BenchKv kv : {BenchKv::kFp32, BenchKv::kBf16, BenchKv::kInt8, BenchKv::kInt4}) {
    for (const char* p : {"full", "h2o"}) {
      benchmark::RegisterBenchmark(absl::StrCat("capacity/len1024/", p, KvSuffix(kv)).c_str(),
                                   BM_Capacity, std::string(p), kv, KvQuant::kNone)
          ->Iterations(1)
          ->Unit(benchmark::kMillisecond);
    }
  }
  // Issue 29: MiKV's demoted store (its pages cost capacity), and requests asking for int8/int4
  // rows on a bf16 pool (packed pages) beside the pools of those types above.
  for (const char* p : {"h2o:demote=int4", "h2o:demote=int4:demote_budget=102"}) {
    benchmark::RegisterBenchmark(absl::StrCat("capacity/len1024/", p, "/bf16kv").c_str(),
                                 BM_Capacity, std::string(p), BenchKv::kBf16, KvQuant::kNone)
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  }
  for (KvQuant q : {KvQuant::kInt8, KvQuant::kInt4}) {
    benchmark::RegisterBenchmark(
        absl::StrCat("capacity/len1024/h2o/bf16kv/", KvQuantName(q), "-per-request")
            .c_str(),
        BM_Capacity, std::string("h2o"), BenchKv::kBf16, q)
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace

void RegisterAll() { Register(); }

}  // namespace heavykv::bench
