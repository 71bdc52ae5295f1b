// quant_gemm/<type>/m<M>/n<N>[/k<K>]: MatmulQuant (kernels/cpu/quant_gemm.h) on GGUF block
// formats at the llama3.2-1b projection shapes (n = 2048 outputs of k = 2048 inputs as wq / wo,
// n = 8192 as the MLP's gate and up, k = 8192 as its down), for a batch-1 decode (M = 1), decode
// batches of 8 and 32 and a 512-token prefill chunk, beside quant_gemm/<type>-fp32/..., the
// dequantize-to-fp32 path on the same matrices wherever MatmulQuant takes the int8 one, and
// quant_gemm/f32-packed/..., MatmulPacked on the same shapes in fp32. Counters:
// bytes_per_second (the weight bytes streamed) and flops (2 m n k per call). Each iteration
// multiplies by the next of several copies of the matrix, at least 64 MiB in all, so the weights
// come from memory as in a real step rather than from the last-level cache.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/aligned_vector.h"
#include "kernels/cpu/packed_gemm.h"
#include "kernels/cpu/quant_gemm.h"

namespace heavykv::bench {
namespace {

constexpr int64_t kStreamBytes = int64_t(64) << 20;

std::vector<float> RandomWeights(int64_t n, int64_t k) {
  std::vector<float> w(n * k);
  std::mt19937 rng(42);
  std::normal_distribution<float> g(0.0f, 0.02f);
  for (float& v : w) v = g(rng);
  return w;
}

// Copies of one n x k matrix of `type`, built once per shape and kept for the run.
const std::vector<cpu::QuantMatrix>& QuantCopies(cpu::QuantType type, int64_t n, int64_t k) {
  static std::map<std::tuple<cpu::QuantType, int64_t, int64_t>, std::vector<cpu::QuantMatrix>>
      cache;
  auto& copies = cache[{type, n, k}];
  if (copies.empty()) {
    const std::vector<float> w = RandomWeights(n, k);
    auto first = cpu::QuantMatrix::Quantize(type, w.data(), n, k);
    const int64_t count =
        std::max<int64_t>(1, (kStreamBytes + first->bytes() - 1) / first->bytes());
    for (int64_t c = 1; c < count; ++c) {
      copies.push_back(*cpu::QuantMatrix::FromRows(type, n, k, first->row(0), first->bytes()));
    }
    copies.push_back(std::move(*first));
  }
  return copies;
}

const std::vector<cpu::PackedMatrix>& PackedCopies(int64_t n, int64_t k) {
  static std::map<std::pair<int64_t, int64_t>, std::vector<cpu::PackedMatrix>> cache;
  auto& copies = cache[{n, k}];
  if (copies.empty()) {
    const std::vector<float> w = RandomWeights(n, k);
    copies.push_back(cpu::PackedMatrix::FromRowMajor(w.data(), n, k));
    if (copies[0].bytes() < kStreamBytes) {
      copies.push_back(cpu::PackedMatrix::FromRowMajor(w.data(), n, k));
    }
  }
  return copies;
}

void SetCounters(benchmark::State& state, int64_t m, int64_t n, int64_t k, int64_t bytes) {
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["flops"] =
      benchmark::Counter(double(state.iterations()) * 2.0 * m * n * k, benchmark::Counter::kIsRate);
}

// path kAuto is MatmulQuant; kFp32 is the dequantize-to-fp32 path, which was MatmulQuant for every
// m before the int8 path: the "before" beside it in the same run.
void BM_QuantGemm(benchmark::State& state, cpu::QuantType type, int64_t m, int64_t n, int64_t k,
                  cpu::QuantPath path) {
  const auto& copies = QuantCopies(type, n, k);
  // Activations of a real spread (the int8 path quantizes them per 32 inputs).
  AlignedVector<float> x(m * k), y(m * n);
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (float& v : x) v = g(rng);
  size_t next = 0;
  for (auto _ : state) {
    cpu::MatmulQuantWith(cpu::BestIsa(), x.data(), copies[next], y.data(), m, n, false, path);
    next = (next + 1) % copies.size();
    benchmark::DoNotOptimize(y.data());
  }
  SetCounters(state, m, n, k, copies[0].bytes());
}

void BM_PackedGemm(benchmark::State& state, int64_t m, int64_t n, int64_t k) {
  const auto& copies = PackedCopies(n, k);
  AlignedVector<float> x(m * k, 0.01f), y(m * n);
  size_t next = 0;
  for (auto _ : state) {
    cpu::MatmulPacked(x.data(), copies[next], y.data(), m, n, false);
    next = (next + 1) % copies.size();
    benchmark::DoNotOptimize(y.data());
  }
  SetCounters(state, m, n, k, copies[0].bytes());
}

}  // namespace

void RegisterQuant() {
  // (n, k): wq / wo (2048 x 2048), the MLP's gate and up (8192 x 2048) and down (2048 x 8192).
  const std::pair<int64_t, int64_t> shapes[] = {{2048, 2048}, {8192, 2048}, {2048, 8192}};
  for (const auto& [n, k] : shapes) {
    for (int64_t m : {1, 8, 32, 512}) {
      const std::string shape =
          absl::StrCat("/m", m, "/n", n, k == 2048 ? "" : absl::StrCat("/k", k));
      benchmark::RegisterBenchmark(absl::StrCat("quant_gemm/f32-packed", shape).c_str(),
                                   BM_PackedGemm, m, n, k)
          ->UseRealTime();
      for (cpu::QuantType type : cpu::kAllQuantTypes) {
        if (type == cpu::QuantType::kF32) continue;
        benchmark::RegisterBenchmark(
            absl::StrCat("quant_gemm/", cpu::QuantTypeName(type), shape).c_str(), BM_QuantGemm,
            type, m, n, k, cpu::QuantPath::kAuto)
            ->UseRealTime();
        if (cpu::QuantUsesInt8(type, m)) {
          benchmark::RegisterBenchmark(
              absl::StrCat("quant_gemm/", cpu::QuantTypeName(type), "-fp32", shape).c_str(),
              BM_QuantGemm, type, m, n, k, cpu::QuantPath::kFp32)
              ->UseRealTime();
        }
      }
    }
  }
}

}  // namespace heavykv::bench
