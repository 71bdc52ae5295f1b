// quant_gemm/<type>/m<M>/n<N>: MatmulQuant (kernels/cpu/quant_gemm.h) on GGUF block formats at
// the llama3.2-1b projection shapes (k = 2048 inputs; n = 2048 outputs as wq / wo, n = 8192 as the
// MLP's gate and up), for a batch-1 decode (M = 1), a batch-32 decode and a 512-token prefill
// chunk, beside quant_gemm/f32-packed/..., MatmulPacked on the same shapes in fp32. Counters:
// bytes_per_second (the weight bytes streamed) and flops (2 m n k per call). Each iteration
// multiplies by the next of several copies of the matrix, at least 64 MiB in all, so the weights
// come from memory as in a real step rather than from the last-level cache.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/packed_gemm.h"
#include "kernels/cpu/quant_gemm.h"
#include "memory/aligned_vector.h"

namespace heavykv::bench {
namespace {

constexpr int64_t kK = 2048;
constexpr int64_t kStreamBytes = int64_t(64) << 20;

std::vector<float> RandomWeights(int64_t n) {
  std::vector<float> w(n * kK);
  std::mt19937 rng(42);
  std::normal_distribution<float> g(0.0f, 0.02f);
  for (float& v : w) v = g(rng);
  return w;
}

// Copies of one n x kK matrix of `type`, built once per shape and kept for the run.
const std::vector<cpu::QuantMatrix>& QuantCopies(cpu::QuantType type, int64_t n) {
  static std::map<std::pair<cpu::QuantType, int64_t>, std::vector<cpu::QuantMatrix>> cache;
  auto& copies = cache[{type, n}];
  if (copies.empty()) {
    const std::vector<float> w = RandomWeights(n);
    auto first = cpu::QuantMatrix::Quantize(type, w.data(), n, kK);
    const int64_t count =
        std::max<int64_t>(1, (kStreamBytes + first->bytes() - 1) / first->bytes());
    for (int64_t c = 1; c < count; ++c) {
      copies.push_back(*cpu::QuantMatrix::FromRows(type, n, kK, first->row(0), first->bytes()));
    }
    copies.push_back(std::move(*first));
  }
  return copies;
}

const std::vector<cpu::PackedMatrix>& PackedCopies(int64_t n) {
  static std::map<int64_t, std::vector<cpu::PackedMatrix>> cache;
  auto& copies = cache[n];
  if (copies.empty()) {
    const std::vector<float> w = RandomWeights(n);
    copies.push_back(cpu::PackedMatrix::FromRowMajor(w.data(), n, kK));
    if (copies[0].bytes() < kStreamBytes) {
      copies.push_back(cpu::PackedMatrix::FromRowMajor(w.data(), n, kK));
    }
  }
  return copies;
}

void SetCounters(benchmark::State& state, int64_t m, int64_t n, int64_t bytes) {
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["flops"] = benchmark::Counter(double(state.iterations()) * 2.0 * m * n * kK,
                                               benchmark::Counter::kIsRate);
}

void BM_QuantGemm(benchmark::State& state, cpu::QuantType type, int64_t m, int64_t n) {
  const auto& copies = QuantCopies(type, n);
  AlignedVector<float> x(m * kK, 0.01f), y(m * n);
  size_t next = 0;
  for (auto _ : state) {
    cpu::MatmulQuant(x.data(), copies[next], y.data(), m, n, false);
    next = (next + 1) % copies.size();
    benchmark::DoNotOptimize(y.data());
  }
  SetCounters(state, m, n, copies[0].bytes());
}

void BM_PackedGemm(benchmark::State& state, int64_t m, int64_t n) {
  const auto& copies = PackedCopies(n);
  AlignedVector<float> x(m * kK, 0.01f), y(m * n);
  size_t next = 0;
  for (auto _ : state) {
    cpu::MatmulPacked(x.data(), copies[next], y.data(), m, n, false);
    next = (next + 1) % copies.size();
    benchmark::DoNotOptimize(y.data());
  }
  SetCounters(state, m, n, copies[0].bytes());
}

}  // namespace

void RegisterQuant() {
  for (int64_t n : {2048, 8192}) {
    for (int64_t m : {1, 32, 512}) {
      const std::string shape = absl::StrCat("/m", m, "/n", n);
      benchmark::RegisterBenchmark(absl::StrCat("quant_gemm/f32-packed", shape).c_str(),
                                   BM_PackedGemm, m, n)
          ->UseRealTime();
      for (cpu::QuantType type : cpu::kAllQuantTypes) {
        if (type == cpu::QuantType::kF32) continue;
        benchmark::RegisterBenchmark(
            absl::StrCat("quant_gemm/", cpu::QuantTypeName(type), shape).c_str(), BM_QuantGemm,
            type, m, n)
            ->UseRealTime();
      }
    }
  }
}

}  // namespace heavykv::bench
