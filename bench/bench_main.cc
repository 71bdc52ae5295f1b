// heavykv_bench: runs the Google Benchmark suite, then prints the ratios of docs/BENCHMARKS.md,
// each formed from two figures measured in this same run, and their targets.
//
//   heavykv_bench [--threads N] [--summary_json FILE] [--bench_dir DIR] [--peer_json FILE]
//                 [google benchmark flags]
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_fixtures.h"
#include "kernels/cpu/gemm.h"
#include "nlohmann/json.hpp"

namespace heavykv::bench {
void RegisterAll();
void RegisterServe();
void RegisterPrefixCache();
void RegisterChoices();
void RegisterTokenizer();
void RegisterQuant();
void RegisterGguf();
void RegisterGrammar();
void RegisterSampler();
}

namespace {

struct Figure {
  double seconds = 0;  // real time per iteration
  std::map<std::string, double> counters;
};

// Prints like the console reporter and keeps every run's figures by name.
class CollectingReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Iteration || r.error_occurred) continue;
      Figure& f = figures[r.run_name.function_name];
      f.seconds = r.GetAdjustedRealTime() /
                  benchmark::GetTimeUnitMultiplier(r.time_unit);
      for (const auto& [k, c] : r.counters) f.counters[k] = c.value;
    }
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, Figure> figures;
};

struct Ratio {
  std::string name, formula, target;
  double value = 0;
  bool met = false;
};

}  // namespace

int main(int argc, char** argv) {
  std::string summary_path, peer_path;
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (!std::strncmp(argv[i], "--summary_json=", 15)) {
      summary_path = argv[i] + 15;
    } else if (!std::strncmp(argv[i], "--threads=", 10)) {
      threads = std::atoi(argv[i] + 10);
    } else if (!std::strncmp(argv[i], "--peer_json=", 12)) {
      peer_path = argv[i] + 12;
    } else if (!std::strncmp(argv[i], "--bench_dir=", 12)) {
      heavykv::bench::SetScratchDir(argv[i] + 12);
    } else {
      rest.push_back(argv[i]);
    }
  }
  heavykv::cpu::SetNumThreads(threads);
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  heavykv::bench::RegisterAll();
  heavykv::bench::RegisterServe();
  heavykv::bench::RegisterTokenizer();
  heavykv::bench::RegisterQuant();
  heavykv::bench::RegisterGguf();
  heavykv::bench::RegisterGrammar();
  heavykv::bench::RegisterSampler();
  heavykv::bench::RegisterPrefixCache();
  heavykv::bench::RegisterChoices();
  CollectingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);

  auto& F = reporter.figures;
  auto has = [&](const std::string& n) { return F.count(n) > 0; };
  std::vector<Ratio> ratios;
  auto add = [&](std::string name, std::string formula, double value, std::string target,
                 bool met) { ratios.push_back({name, formula, target, value, met}); };
  if (has("bandwidth/memcpy") && has("decode/b1/ctx64/full")) {
    const double bw = F["bandwidth/memcpy"].counters["bytes_per_second"];
    const double w = F["decode/b1/ctx64/full"].counters["weight_bytes"];
    add("batch-1 decode weight streaming / memcpy bandwidth",
        "weights bytes per step / step time over memcpy bytes/s", w / bw, ">= 0.70",
        w / bw >= 0.70);
    if (has("bandwidth/read")) {
      const double rd = F["bandwidth/read"].counters["bytes_per_second"];
      add("batch-1 decode weight streaming / read bandwidth", "same over read-only bytes/s",
          w / rd, "(info)", true);
    }
  }
  if (has("sgemm/1024") && has("decode/b32/ctx64/full")) {
    const double v = F["decode/b32/ctx64/full"].counters["flops"] / F["sgemm/1024"].counters["flops"];
    add("batch-32 decode FLOP/s / sgemm 1024^3 FLOP/s",
        "model FLOPs per step / step time over square sgemm", v, ">= 0.60", v >= 0.60);
    if (has("gemm/decode-shapes-b32/packed")) {
      const double g = F["decode/b32/ctx64/full"].counters["flops"] /
                       F["gemm/decode-shapes-b32/packed"].counters["flops"];
      add("batch-32 decode FLOP/s / its GEMMs alone", "over the same GEMM calls, nothing else",
          g, "(info)", true);
    }
  }
  if (has("gemm/decode-shapes-b32/packed") && has("gemm/decode-shapes-b32/openblas")) {
    const double g = F["gemm/decode-shapes-b32/packed"].counters["flops"] /
                     F["gemm/decode-shapes-b32/openblas"].counters["flops"];
    add("batch-32 step GEMMs: packed kernel / OpenBLAS", "same shapes, weights from memory", g,
        "(info)", true);
    if (has("sgemm/1024")) {
      const double o = F["gemm/decode-shapes-b32/openblas"].counters["flops"] /
                       F["sgemm/1024"].counters["flops"];
      add("batch-32 step GEMMs through OpenBLAS / sgemm 1024^3", "the BLAS-only engine's ceiling",
          o, "(info)", true);
    }
  }
  auto time_ratio = [&](const std::string& a, const std::string& b, const std::string& target,
                        double limit, bool strictly_less) {
    if (!has(a) || !has(b)) return;
    const double v = F[a].seconds / F[b].seconds;
    add(a + " / " + b, "step time ratio", v, target, strictly_less ? v < limit : v <= limit);
  };
  // Structured outputs (issue 43): masks, compiles, and decode under a JSON schema.
  for (const char* vocab : {"llama3", "qwen"}) {
    const std::string m = absl::StrCat("grammar/mask/", vocab);
    if (!has(m)) continue;
    const double p50 = F[m].counters["mask_p50_us"], p99 = F[m].counters["mask_p99_us"];
    const double compile = F[m].counters["compile_p50_us"];
    add(m + " mask p50", "microseconds per token, one core", p50, "<= 50", p50 <= 50);
    add(m + " mask p99", "microseconds per token, one core", p99, "<= 1000", p99 <= 1000);
    add(m + " compile p50", "microseconds per schema", compile, "<= 5000", compile <= 5000);
  }
  for (const char* b : {"b1", "b32"}) {
    const std::string json = absl::StrCat("grammar/decode/json/", b);
    const std::string free = absl::StrCat("grammar/decode/free/", b);
    if (!has(json) || !has(free)) continue;
    const double v = F[json].counters["tokens_per_s"] / F[free].counters["tokens_per_s"];
    add(json + " / " + free, "decode tokens/s ratio", v, ">= 0.95", v >= 0.95);
  }
  // The sampling API (issue 44): 32 rows sampled with every option on, against a decode step.
  time_ratio("sampler/b32/all_on", "decode/b32/ctx512/full", "<= 0.03", 0.03, false);
  time_ratio("sampler/b32/plain", "decode/b32/ctx512/full", "(info)", 1e9, false);
  time_ratio("sampler/b32/penalties", "sampler/b32/plain", "(info)", 1e9, false);
  time_ratio("decode/b1/ctx512/h2o512", "decode/b1/ctx512/full", "<= 1.10", 1.10, false);
  time_ratio("decode/b32/ctx512/h2o512", "decode/b32/ctx512/full", "<= 1.10", 1.10, false);
  time_ratio("decode/b1/ctx4096/h2o819", "decode/b1/ctx4096/full", "< 1.00", 1.0, true);
  // The same two 512-context ratios with the steps interleaved in one benchmark (the median of
  // per-iteration ratios): the figure to read on a noisy shared machine.
  for (const char* p : {"tova", "scissorhands", "knorm", "snapkv"}) {
    time_ratio(absl::StrCat("decode/b32/ctx512/", p, "512"), "decode/b32/ctx512/full", "<= 1.10",
               1.10, false);
  }
  for (const char* b : {"decode/b1/ctx512/h2o512-vs-full", "decode/b32/ctx512/h2o512-vs-full",
                        "decode/b32/ctx512/tova512-vs-full",
                        "decode/b32/ctx512/scissorhands512-vs-full",
                        "decode/b32/ctx512/knorm512-vs-full",
                        "decode/b32/ctx512/snapkv512-vs-full"}) {
    if (!has(b)) continue;
    const double v = F[b].counters["ratio"];
    add(absl::StrCat(b, " (interleaved, median)"), "step time ratio", v, "<= 1.10", v <= 1.10);
  }
  // Page against token granularity on the h2o step (issue 17: page faster): whole steps, and the
  // eviction work alone; sums over whole cycles of 16 steps.
  for (const char* b : {"decode/b1/ctx512/h2o512-page-vs-token",
                        "decode/b32/ctx512/h2o512-page-vs-token", "evict/b1/h2o512-page-vs-token",
                        "evict/b32/h2o512-page-vs-token"}) {
    if (!has(b)) continue;
    const double v = F[b].counters["ratio_of_sums"];
    add(absl::StrCat(b, " (interleaved, sums)"), "step time ratio", v, "< 1", v < 1.0);
  }
  if (has("decode/b32/ctx512/h2o512-page-vs-full")) {
    const double v = F["decode/b32/ctx512/h2o512-page-vs-full"].counters["ratio_of_sums"];
    add("decode/b32/ctx512/h2o512-page-vs-full (interleaved, sums)", "step time ratio", v,
        "<= 1.10", v <= 1.10);
  }
  // bf16 storage (--kv-dtype bf16, --weight-dtype bf16): the same steps, the same fp32
  // arithmetic (FMAs on widened values), half the bytes of K/V and/or weights.
  const std::pair<const char*, const char*> bf16_steps[] = {
      {"decode/b32/ctx64/full/bf16kv", "batch-32 decode, bf16 K/V: FLOP/s / sgemm"},
      {"decode/b32/ctx64/full/bf16w", "batch-32 decode, bf16 weights: FLOP/s / sgemm"},
      {"decode/b32/ctx64/full/bf16w/bf16kv", "batch-32 decode, bf16 weights+K/V: FLOP/s / sgemm"},
  };
  for (const auto& [bench, label] : bf16_steps) {
    if (!has("sgemm/1024") || !has(bench)) continue;
    const double v = F[bench].counters["flops"] / F["sgemm/1024"].counters["flops"];
    add(label, "as above, bf16 storage, fp32 arithmetic", v, ">= 0.60", v >= 0.60);
  }
  if (has("bandwidth/memcpy") && has("decode/b1/ctx64/full/bf16w")) {
    const double bw = F["bandwidth/memcpy"].counters["bytes_per_second"];
    const double w = F["decode/b1/ctx64/full/bf16w"].counters["weight_bytes"];
    add("batch-1 decode, bf16 weights: weight bytes/s / memcpy", "as above, bf16 weights", w / bw,
        ">= 0.70", w / bw >= 0.70);
  }
  time_ratio("decode/b1/ctx64/full/bf16w", "decode/b1/ctx64/full", "(info)", 1e9, false);
  if (has("gemm/decode-shapes-b32/packed-bf16") && has("gemm/decode-shapes-b32/packed")) {
    const double g = F["gemm/decode-shapes-b32/packed-bf16"].counters["flops"] /
                     F["gemm/decode-shapes-b32/packed"].counters["flops"];
    add("batch-32 step GEMMs: bf16 weights / fp32 weights", "FLOP/s ratio", g, "(info)", true);
  }
  time_ratio("decode/b32/ctx64/full/bf16kv", "decode/b32/ctx64/full", "(info)", 1e9, false);
  time_ratio("decode/b32/ctx512/h2o512/bf16kv", "decode/b32/ctx512/full/bf16kv", "<= 1.10", 1.10,
             false);
  time_ratio("decode/b32/ctx512/full/bf16kv", "decode/b32/ctx512/full", "(info)", 1e9, false);
  for (const char* p : {"full", "h2o"}) {
    const std::string bf = absl::StrCat("capacity/len1024/", p, "/bf16kv");
    if (has(bf) && has("capacity/len1024/full")) {
      const double v = F[bf].counters["sequences"] / F["capacity/len1024/full"].counters["sequences"];
      add(absl::StrCat("capacity ", p, " bf16 K/V / full fp32 (same pool bytes)"),
          "resident sequences ratio", v, "(info)", true);
    }
  }
  for (const char* p : {"tova", "scissorhands", "knorm", "snapkv", "h2o:granularity=page"}) {
    const std::string c = absl::StrCat("capacity/len1024/", p);
    if (!has(c) || !has("capacity/len1024/h2o")) continue;
    const double v = F[c].counters["sequences"] / F["capacity/len1024/h2o"].counters["sequences"];
    add(absl::StrCat("capacity ", p, " 20% / h2o 20% (1024-token sequences, one pool)"),
        "resident sequences ratio", v, "== 1", v == 1.0);
  }
  if (has("capacity/len1024/h2o") && has("capacity/len1024/full")) {
    const double v = F["capacity/len1024/h2o"].counters["sequences"] /
                     F["capacity/len1024/full"].counters["sequences"];
    add("capacity h2o 20% / full (1024-token sequences, one pool)", "resident sequences ratio",
        v, ">= 4.5", v >= 4.5);
  }

  // KV precision (issue 29): int8 and int4 K/V against bf16, side by side.
  for (const char* kv : {"int8", "int4"}) {
    for (const char* ctx : {"16384", "32768"}) {
      const std::string r = absl::StrCat("attention/gqa8/b1/ctx", ctx, "/", kv, "kv-vs-bf16kv");
      if (!has(r)) continue;
      const double v = F[r].counters["ratio"];
      const bool int8 = std::string(kv) == "int8";
      add(absl::StrCat("decode attention ctx ", ctx, " ", kv, " K/V / bf16 (GQA 4, hd 128)"),
          "tokens/s ratio, interleaved", v, int8 ? ">= 1.6" : "(info)", int8 ? v >= 1.6 : true);
    }
  }
  for (const char* kv : {"int8", "int4"}) {
    const std::string q = absl::StrCat("capacity/len1024/h2o/", kv, "kv");
    if (!has(q) || !has("capacity/len1024/h2o/bf16kv")) continue;
    const double v =
        F[q].counters["sequences"] / F["capacity/len1024/h2o/bf16kv"].counters["sequences"];
    add(absl::StrCat("capacity h2o 20% ", kv, " K/V / h2o 20% bf16 (same pool bytes, hd 16)"),
        "resident sequences ratio", v, "(info)", true);
  }
  for (const char* kv : {"int8", "int4"}) {
    const std::string q = absl::StrCat("serve/64x512+512/h2o/bf16w/", kv, "kv");
    if (!has(q) || !has("serve/64x512+512/h2o/bf16")) continue;
    const double v =
        F[q].counters["max_running"] / F["serve/64x512+512/h2o/bf16"].counters["max_running"];
    const bool int8 = std::string(kv) == "int8";
    add(absl::StrCat("serve 64x(512+512) h2o 20% ", kv, " K/V / bf16 K/V (same pool bytes)"),
        "concurrent sequences ratio", v, int8 ? ">= 1.8" : "(info)", int8 ? v >= 1.8 : true);
  }

  // The CUDA targets (issue 5), from counters the cuda/ benchmarks compute in their own run.
  const std::string att = "cuda/attention/decode/b64/ctx4096/q32kv8/hd128/";
  for (const char* kernel : {"mma", "stream", "two-pass"}) {
    const std::string scores = att + "scores/" + kernel;
    if (!has(scores)) continue;
    const double f = F[scores].counters["frac_of_4.8TBps"];
    add(absl::StrCat("GPU decode attention with scores (", kernel, "): K+V bytes/s / 4.8 TB/s"),
        "b64 ctx4096 32q/8kv hd128", f, ">= 0.70", f >= 0.70);
    const double t = F[scores].counters["time_vs_noscores"];
    if (t > 0) {
      add(absl::StrCat("GPU decode attention (", kernel, "): with scores / without"),
          "time ratio", t, "<= 1.10", t <= 1.10);
    }
  }
  if (has("cuda/decode/llama3-1b/b64/ctx1024")) {
    const double v = F["cuda/decode/llama3-1b/b64/ctx1024"].counters["vs_bound"];
    add("GPU decode llama3-1b b64: step / (weights+KV bytes at 4.8 TB/s)", "time ratio", v,
        "<= 1.5", v <= 1.5);
  }
  // Quantized weights on the GPU (issue 32; never run when written).
  for (const char* f : {"q4_K+q6_K", "q4_0", "q8_0", "q5_K+q6_K", "q6_K"}) {
    const std::string q = absl::StrCat("cuda/quant_gemv/llama3.2-1b/b1/", f);
    if (!has(q)) continue;
    const double v = F[q].counters["frac_of_4.8TBps"];
    const bool target = std::string(f) == "q4_K+q6_K";
    add(absl::StrCat("GPU quantized GEMVs of a llama3.2-1b decode step (", f, ") / 4.8 TB/s"),
        "b1, the blocks' real bytes", v, target ? ">= 0.70" : "(info)", !target || v >= 0.70);
  }
  for (const char* b : {"b1", "b64"}) {
    const std::string base = absl::StrCat("cuda/decode/llama3.2-1b-q4_k_m/", b, "/ctx1024/");
    if (!has(base + "quantized") || !has(base + "bf16")) continue;
    auto& q = F[base + "quantized"].counters;
    auto& h = F[base + "bf16"].counters;
    add(absl::StrCat("GPU decode Q4_K_M 1B ", b, ": --gpu-weights quantized / bf16"), "step time",
        q["tokens_per_second"] > 0 ? h["tokens_per_second"] / q["tokens_per_second"] : 0,
        "(info)", true);
    if (std::string(b) == "b1") {
      const double m = q["device_weight_bytes"] / q["model_held_bytes"];
      add("GPU Q4_K_M 1B weights on the device / the model's own bytes", "--gpu-weights quantized",
          m, "<= 1.1", m <= 1.1);
    }
  }
  if (has("cuda/capacity/len4096/h2o20-vs-full")) {
    const double v = F["cuda/capacity/len4096/h2o20-vs-full"].counters["ratio"];
    add("GPU capacity h2o 20% / full (4096-token sequences)", "resident sequences ratio", v,
        ">= 4.5", v >= 4.5);
  }
  if (has("serve/64x512+512/h2o") && has("serve/64x512+512/full")) {
    auto& h = F["serve/64x512+512/h2o"].counters;
    auto& f = F["serve/64x512+512/full"].counters;
    const double c = h["max_running"] / f["max_running"];
    const double t = h["tokens_per_second"] / f["tokens_per_second"];
    add("serving 64x(512+512): most running at once, h2o 20% / full", "one fixed pool", c,
        ">= 4", c >= 4);
    add("serving 64x(512+512): tokens/s, h2o 20% / full", "one fixed pool", t, ">= 2", t >= 2);
  }
  for (const char* p : {"full", "h2o"}) {
    const std::string bf = absl::StrCat("serve/64x512+512/", p, "/bf16");
    if (!has(bf) || !has("serve/64x512+512/full")) continue;
    auto& b = F[bf].counters;
    auto& f = F["serve/64x512+512/full"].counters;
    add(absl::StrCat("serving, ", p, " bf16 w+K/V / full fp32: most running"),
        "pool of the same bytes", b["max_running"] / f["max_running"], "(info)", true);
    add(absl::StrCat("serving, ", p, " bf16 w+K/V / full fp32: tokens/s"),
        "pool of the same bytes", b["tokens_per_second"] / f["tokens_per_second"], "(info)", true);
  }
  // Prefix caching (issue 30), both engines in the same run.
  if (has("prefix/llama3.2-1b/q4_k_m/ttft2000")) {
    const double v = F["prefix/llama3.2-1b/q4_k_m/ttft2000"].counters["ttft_ratio"];
    add("prefix cache: TTFT with a cached 2000-token prefix / cold (Q4_K_M 1B)", "time ratio", v,
        "<= 0.15", v <= 0.15);
  }
  if (has("prefix/llama3.2-1b/q4_k_m/chat8")) {
    auto& c = F["prefix/llama3.2-1b/q4_k_m/chat8"].counters;
    add("prefix cache: 8-turn chat tokens/s, on / off (Q4_K_M 1B)", "tokens/s ratio",
        c["ratio"], ">= 3", c["ratio"] >= 3 && c["same_tokens"] == 1);
  }
  // GGUF models against llama.cpp on the same file (issue 14 section 5): --peer_json is what
  // scripts/bench-llamacpp.sh measured with llama.cpp's own tools just before this run.
  if (!peer_path.empty()) {
    std::ifstream in(peer_path);
    const nlohmann::json peer = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (peer.is_discarded() || !peer.contains("models")) {
      std::fprintf(stderr, "--peer_json=%s: not a bench-llamacpp.sh result\n", peer_path.c_str());
    } else {
      for (const auto& item : peer["models"].items()) {
        // Named copies, not structured bindings: clang 14 cannot capture those in the lambda.
        const std::string mix = item.key();
        const nlohmann::json& p = item.value();
        const std::string base = absl::StrCat("gguf/llama3.2-1b/", mix, "/");
        auto vs = [&](const std::string& bench, const char* key, const std::string& label,
                      double limit) {
          if (!has(base + bench) || !p.contains(key)) return;
          const double v = F[base + bench].counters["tokens"] / p[key].get<double>();
          add(absl::StrCat("llama3.2-1b ", mix, ": ", label), "tokens/s over llama.cpp's", v,
              absl::StrFormat(">= %.1f", limit), v >= limit);
        };
        vs("decode-b1", "tg128", "batch-1 decode / llama-bench -n 128", 1.0);
        vs("prefill512", "pp512", "prefill 512 / llama-bench -p 512", 1.0);
        vs("prefill4096", "pp4096", "prefill 4096 / llama-bench -p 4096", 1.0);
        vs("decode-b32", "batched_tg_npl32", "32-seq decode / llama-batched-bench", 1.5);
        if (p.contains("load_to_first_token_s") && p.contains("heavykv_load_to_first_token_s")) {
          const double v = p["heavykv_load_to_first_token_s"].get<double>() /
                           p["load_to_first_token_s"].get<double>();
          add(absl::StrCat("llama3.2-1b ", mix, ": load to first token / llama.cpp's"),
              "wall time ratio (the script's)", v, "<= 1.5", v <= 1.5);
        }
      }
    }
  }
  std::printf("\n%-62s %9s %9s %s\n", "ratio (measured side by side in this run)", "value",
              "target", "met");
  for (const Ratio& r : ratios) {
    std::printf("%-62s %9.3f %9s %s\n", r.name.c_str(), r.value, r.target.c_str(),
                r.met ? "yes" : "NO");
  }
  if (!summary_path.empty()) {
    std::ofstream out(summary_path);
    out << "{\"threads\":" << threads << ",\"figures\":{";
    bool first = true;
    for (const auto& [name, f] : F) {
      out << (first ? "" : ",") << "\"" << name << "\":{\"seconds\":" << f.seconds;
      for (const auto& [k, v] : f.counters) out << ",\"" << k << "\":" << v;
      out << "}";
      first = false;
    }
    out << "},\"ratios\":[";
    for (size_t i = 0; i < ratios.size(); ++i) {
      out << (i ? "," : "") << absl::StrFormat(
          "{\"name\":\"%s\",\"value\":%.4f,\"target\":\"%s\",\"met\":%s}", ratios[i].name,
          ratios[i].value, ratios[i].target, ratios[i].met ? "true" : "false");
    }
    out << "]}\n";
  }
  benchmark::Shutdown();
  return 0;
}
