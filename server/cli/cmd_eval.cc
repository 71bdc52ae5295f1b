// heavykv eval: perplexity and top-1 agreement of policies x budgets on a text file.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/eval/evaluator.h"
#include "engine/eval/passkey.h"
#include "engine/runner/step_runner.h"
#include "server/flags/cli_flags.h"
#include "server/flags/dtype_flags.h"
#include "server/flags/policy_flags.h"
#include "server/cli/commands.h"
#include "server/cli/svg_plot.h"

namespace heavykv::cli {

namespace {

// Writes `series` as an SVG chart to `path` (--plot), with a logarithmic y axis when the values
// (up to o.y_clip when set) span more than a factor of 4 (a starved policy would flatten every
// other line).
absl::Status WriteChart(const std::string& path, const std::vector<PlotSeries>& series,
                        PlotOptions o) {
  double y_lo = INFINITY, y_hi = -INFINITY;
  for (const PlotSeries& line : series) {
    for (const auto& [x, y] : line.points) {
      y_lo = std::min(y_lo, y);
      y_hi = std::max(y_hi, o.y_clip > 0 ? std::min(y, o.y_clip) : y);
    }
  }
  o.log_y = y_lo > 0 && y_hi / y_lo > 4;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << LinePlotSvg(series, o);
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write --plot ", path));
  return absl::OkStatus();
}

// How far above the full cache the perplexity axis of `eval --plot` reaches (a factor).
constexpr double kPlotClipOverFull = 1.25;

// Perplexity against budget: one line per policy (a point per budget), the full cache as a
// dashed reference line across the budgets; with several K/V types (the precision axis), a line
// per (policy, type), each named with its type, and a dashed full line per type.
absl::Status WritePlot(const std::string& path, const std::vector<EvalResult>& results,
                       const std::string& model_path) {
  std::vector<PlotSeries> series;
  std::map<std::string, size_t> index;
  std::vector<std::pair<std::string, double>> full;  // per K/V type
  std::set<std::string> types;
  for (const EvalResult& r : results) types.insert(r.kv_dtype);
  auto name = [&](const EvalResult& r) {
    return types.size() > 1 ? absl::StrCat(r.policy, " ", r.kv_dtype) : r.policy;
  };
  double lo = INFINITY, hi = -INFINITY;
  int32_t window = 0;
  for (const EvalResult& r : results) {
    window = r.window;
    if (r.policy == "full") {
      full.emplace_back(name(r), r.ppl);
      continue;
    }
    auto [it, added] = index.try_emplace(name(r), series.size());
    if (added) series.push_back({name(r), {}, false});
    series[it->second].points.push_back({double(r.budget_tokens), r.ppl});
    lo = std::min(lo, double(r.budget_tokens));
    hi = std::max(hi, double(r.budget_tokens));
  }
  if (!std::isfinite(lo)) lo = hi = window;
  PlotOptions o;
  for (const auto& [line, ppl] : full) {
    series.push_back({line, {{lo, ppl}, {hi, ppl}}, true});
    // The useful range: up to kPlotClipOverFull x the (worst) full cache's perplexity; a policy
    // worse than that (knorm on the bundled model, 3.9 to 7.8 against 2.87) is clipped and
    // labelled.
    o.y_clip = std::max(o.y_clip, kPlotClipOverFull * ppl);
  }
  o.title = absl::StrCat("Perplexity against KV budget: ",
                         std::filesystem::path(model_path).filename().string());
  o.x_label = absl::StrCat("KV budget (tokens kept per layer and kv head; window ", window, ")");
  o.y_label = "perplexity";
  return WriteChart(path, series, o);
}

// One row per policy: its budget, the predictions scored, and each chunk's perplexity.
void PrintStream(const std::vector<StreamEvalResult>& results, bool json) {
  std::FILE* table = json ? stderr : stdout;
  for (const StreamEvalResult& r : results) {
    std::fprintf(table, "%-8s budget %5d  %8lld tokens%s  ppl %.4f  chunks:", r.policy.c_str(),
                 r.budget_tokens, static_cast<long long>(r.tokens),
                 r.past_context ? " (past the context)" : "", r.ppl);
    for (size_t k = 0; k < r.chunk_ppl.size(); ++k) std::fprintf(table, " %.3f", r.chunk_ppl[k]);
    std::fputc('\n', table);
    if (json) {
      PrintJsonLine({{"task", "stream"},
                     {"policy", r.policy},
                     {"budget", r.budget_tokens},
                     {"budget_spec", r.budget},
                     {"tokens", r.tokens},
                     {"past_context", r.past_context},
                     {"ppl", Rounded(r.ppl, 6)},
                     {"chunk_end", r.chunk_end},
                     {"chunk_ppl", r.chunk_ppl}});
    }
  }
}

// Chunk perplexity against position, one line per policy, and the context length marked.
absl::Status WriteStreamPlot(const std::string& path, const std::vector<StreamEvalResult>& results,
                             const std::string& model_path, int32_t context) {
  std::vector<PlotSeries> series;
  double y_lo = INFINITY, y_hi = -INFINITY;
  for (const StreamEvalResult& r : results) {
    PlotSeries s{r.budget == "full" ? std::string("full")
                                    : absl::StrCat(r.policy, " ", r.budget_tokens),
                 {}, false};
    for (size_t k = 0; k < r.chunk_ppl.size(); ++k) {
      s.points.push_back({double(r.chunk_end[k]), r.chunk_ppl[k]});
      y_lo = std::min(y_lo, r.chunk_ppl[k]);
      y_hi = std::max(y_hi, r.chunk_ppl[k]);
    }
    series.push_back(std::move(s));
  }
  if (std::isfinite(y_lo)) {
    series.push_back({"context length", {{double(context), y_lo}, {double(context), y_hi}}, true});
  }
  PlotOptions o;
  o.title = absl::StrCat("Perplexity of one unbroken stream: ",
                         std::filesystem::path(model_path).filename().string());
  o.x_label = "tokens into the stream (end of each scored chunk)";
  o.y_label = "perplexity of the chunk";
  return WriteChart(path, series, o);
}

int PrintPasskey(const absl::StatusOr<std::vector<PasskeyResult>>& results, bool json) {
  if (!results.ok()) return Fail(results.status());
  std::FILE* table = json ? stderr : stdout;
  std::fprintf(table, "%-8s %8s %8s %8s %8s %9s\n", "policy", "budget", "prompt", "trials",
               "correct", "accuracy");
  for (const PasskeyResult& r : *results) {
    std::fprintf(table, "%-8s %8d %8d %8d %8d %9.3f\n", r.policy.c_str(), r.budget_tokens,
                 r.prompt_tokens, r.trials, r.correct, r.accuracy);
    if (json) {
      PrintJsonLine({{"task", "passkey"},
                     {"policy", r.policy},
                     {"budget", r.budget_tokens},
                     {"budget_spec", r.budget},
                     {"prompt_tokens", r.prompt_tokens},
                     {"trials", r.trials},
                     {"correct", r.correct},
                     {"accuracy", Rounded(r.accuracy, 6)},
                     {"keys", r.keys},
                     {"answers", r.answers}});
    }
  }
  return 0;
}

}  // namespace

int EvalCommand(int argc, char** argv) {
  std::string model_path, tokenizer_path, text_path, policies = "full,window,sink,h2o";
  std::string budgets = "0.2", device_name = "cpu", plot_path, task = "ppl";
  PolicyDefaultFlags policy_defaults;
  DtypeFlags dtypes;
  int64_t window = 0, max_windows = 0, prefill = 0, block_size = 16, threads = 0, trials = 5,
          passkey_tokens = 0, seed = 1, stream_tokens = 0, chunk = 256;
  double recent_fraction = 0.5;
  bool json = false;
  FlagSet flags("eval",
                "heavykv eval --model FILE --tokenizer FILE (--text FILE | --task passkey) [flags]");
  flags.String("model", &model_path, "llama2.c checkpoint or GGUF file (required)");
  flags.String("tokenizer", &tokenizer_path, "llama2.c tokenizer (default: a GGUF model's own); else --text holds ids");
  flags.String("text", &text_path, "stories separated by blank lines (required)");
  flags.Int("window", &window, "tokens per window; 0 = context length");
  flags.Int("max-windows", &max_windows, "windows to evaluate; 0 = all");
  flags.Int("prefill", &prefill,
            "the first N tokens of each window as one prompt chunk (where snapkv selects); "
            "0 = one token per step");
  flags.String("policy", &policies, "comma list of KV policies (name[:key=value]...)");
  flags.String("kv-budget", &budgets, "comma list of budgets: token counts or fractions of the window");
  flags.Double("recent-fraction", &recent_fraction,
               "h2o, scissorhands, snapkv: share of the budget kept for recent tokens");
  policy_defaults.Register(flags);
  flags.Int("block-size", &block_size, "token slots per KV page");
  flags.Int("threads", &threads, "CPU threads; 0 = every core");
  flags.String("device", &device_name, "cpu or cuda: where the forward passes run");
  dtypes.Register(flags);
  flags.Bool("json", &json, "JSON lines on stdout (the table goes to stderr)");
  flags.String("plot", &plot_path,
               "write perplexity against budget as an SVG line chart to this file");
  flags.String("task", &task, "ppl (perplexity of --text) or passkey (retrieval accuracy)");
  flags.Int("stream-tokens", &stream_tokens,
            "ppl of one unbroken stream of N tokens (past the context for window and sink), "
            "scored in --chunk windows");
  flags.Int("chunk", &chunk, "with --stream-tokens: tokens per scored chunk");
  flags.Int("trials", &trials, "passkey: prompts per configuration, keys at evenly spread depths");
  flags.Int("passkey-tokens", &passkey_tokens, "passkey: prompt length; 0 = context - 8");
  flags.Int("seed", &seed, "passkey: seed of the keys");
  if (std::optional<int> code = ParseOrExit(flags, argc, argv)) return *code;
  if (task != "ppl" && task != "passkey") {
    return Fail(absl::InvalidArgumentError("--task must be ppl or passkey"));
  }
  if (model_path.empty() || (task == "ppl" && text_path.empty())) {
    return Fail(absl::InvalidArgumentError("--model and --text are required"));
  }
  if (task == "passkey" && !plot_path.empty()) {
    return Fail(absl::InvalidArgumentError("--plot draws perplexity: use it with --task ppl"));
  }
  if (window < 0 || max_windows < 0 || block_size <= 0 || block_size > 1024) {
    return Fail(absl::InvalidArgumentError(
        "--window and --max-windows must be >= 0, --block-size in [1, 1024]"));
  }
  absl::StatusOr<Device> device = ParseDevice(device_name);
  if (!device.ok()) return Fail(device.status());
  // The precision axis: --kv-dtype may list several types (fp32,int8,int4); perplexity is
  // evaluated for each, the configurations over each pool.
  std::vector<KvDtype> kv_dtypes;
  for (const std::string& name : SplitList(dtypes.kv_name)) {
    absl::StatusOr<KvDtype> k = ResolveKvDtype(*device, name);
    if (!k.ok()) return Fail(k.status());
    kv_dtypes.push_back(*k);
  }
  if (kv_dtypes.size() > 1) {
    if (task != "ppl" || stream_tokens > 0) {
      return Fail(absl::InvalidArgumentError(
          "a list of --kv-dtype is for --task ppl over windows (not --stream-tokens or passkey)"));
    }
    dtypes.kv_name = SplitList(dtypes.kv_name).front();
  }
  if (absl::Status s = dtypes.Resolve(*device); !s.ok()) return Fail(s);
  if (absl::Status s = CheckDevice(*device); !s.ok()) return Fail(s);
  SetThreads(threads);
  absl::StatusOr<Model> model = LoadModel(model_path, dtypes.weights);
  if (!model.ok()) return Fail(model.status());
  absl::StatusOr<std::shared_ptr<const TextTokenizer>> tok =
      LoadOptionalTokenizer(tokenizer_path, model_path, model->config.vocab_size);
  if (!tok.ok()) return Fail(tok.status());
  EvalOptions opt;
  opt.window = static_cast<int32_t>(window);
  opt.max_windows = static_cast<int32_t>(max_windows);
  if (prefill < 0 || prefill > INT32_MAX) {
    return Fail(absl::InvalidArgumentError("--prefill must be in [0, --window)"));
  }
  if (prefill > 0 && (task != "ppl" || stream_tokens > 0)) {
    return Fail(absl::InvalidArgumentError("--prefill is for --task ppl over windows"));
  }
  opt.prefill = static_cast<int32_t>(prefill);
  opt.recent_fraction = recent_fraction;
  opt.block_size = static_cast<int32_t>(block_size);
  opt.device = *device;
  opt.kv_dtype = dtypes.kv;
  opt.gpu_weights = dtypes.gpu_weights;
  if (absl::Status s = policy_defaults.Resolve(); !s.ok()) return Fail(s);
  std::vector<std::string> budget_list = SplitList(budgets);
  if (budget_list.empty()) return Fail(absl::InvalidArgumentError("--kv-budget is empty"));
  for (const std::string& spec : SplitList(policies)) {
    const std::string p =
        SpecWithDefaults(spec, policy_defaults.granularity, policy_defaults.layers);
    if (p == "full") {  // the budget does not apply: evaluate once
      opt.configs.push_back({p, KvBudget{}});
      continue;
    }
    for (const std::string& b : budget_list) {
      absl::StatusOr<KvBudget> kb = KvBudget::Parse(b);
      if (!kb.ok()) return Fail(kb.status());
      opt.configs.push_back({p, *kb});
    }
  }
  if (task == "passkey") {
    if (!*tok) {
      return Fail(absl::InvalidArgumentError("--task passkey needs a tokenizer (--tokenizer)"));
    }
    PasskeyOptions po;
    po.prompt_tokens = static_cast<int32_t>(std::clamp<int64_t>(passkey_tokens, 0, INT32_MAX));
    po.trials = static_cast<int32_t>(std::clamp<int64_t>(trials, 0, INT32_MAX));
    po.seed = static_cast<uint64_t>(seed);
    static_cast<EvalSetup&>(po) = opt;  // the configurations, and where they run
    return PrintPasskey(RunPasskey(*model, **tok, po), json);
  }
  std::ifstream in(text_path, std::ios::binary);
  if (!in) return Fail(absl::NotFoundError(absl::StrCat("cannot open --text ", text_path)));
  std::stringstream buf;
  buf << in.rdbuf();
  std::vector<int32_t> stream;
  if (*tok) {
    stream = BuildEvalStream(**tok, buf.str());
  } else {
    for (absl::string_view part :
         absl::StrSplit(buf.str(), absl::ByAnyChar(" \t\n,"), absl::SkipEmpty())) {
      int32_t id;
      if (!absl::SimpleAtoi(part, &id)) {
        return Fail(absl::InvalidArgumentError(
            absl::StrCat("without --tokenizer, --text must hold token ids; got \"", part, "\"")));
      }
      stream.push_back(id);
    }
  }

  if (stream_tokens > 0) {
    if (task != "ppl") return Fail(absl::InvalidArgumentError("--stream-tokens is a ppl task"));
    StreamEvalOptions so;
    so.tokens = stream_tokens;
    so.chunk = static_cast<int32_t>(std::clamp<int64_t>(chunk, 0, INT32_MAX));
    static_cast<EvalSetup&>(so) = opt;
    // One document, as StreamingLLM's book-length texts: BOS once at the start, the stories
    // joined by their blank lines (a BOS per story would give every window its own sink).
    if (*tok) {
      std::optional<std::vector<int32_t>> whole = (*tok)->Encode(
          buf.str(), (*tok)->add_bos(), /*eos=*/false, nullptr, /*parse_special=*/false);
      if (whole.has_value()) stream = *std::move(whole);
    }
    absl::StatusOr<std::vector<StreamEvalResult>> sr = EvaluateStream(*model, stream, so);
    if (!sr.ok()) return Fail(sr.status());
    PrintStream(*sr, json);
    if (!plot_path.empty()) {
      if (absl::Status s = WriteStreamPlot(plot_path, *sr, model_path, model->config.seq_len);
          !s.ok()) {
        return Fail(s);
      }
      std::fprintf(stderr, "wrote %s\n", plot_path.c_str());
    }
    return 0;
  }
  std::vector<EvalResult> results;
  for (KvDtype kv : kv_dtypes) {  // one or more: dtypes.Resolve refused an empty list
    opt.kv_dtype = kv;
    absl::StatusOr<std::vector<EvalResult>> part = Evaluate(*model, stream, opt);
    if (!part.ok()) return Fail(part.status());
    results.insert(results.end(), part->begin(), part->end());
  }

  std::FILE* table = json ? stderr : stdout;
  int width = 8;  // the policy column: as wide as the longest spec ("snapkv:window=16")
  for (const EvalResult& r : results) width = std::max(width, static_cast<int>(r.policy.size()));
  std::fprintf(table, "%-*s %6s %8s %8s %8s %8s %10s %8s %9s\n", width, "policy", "kv",
               "budget", "tokens", "window", "windows", "ppl", "top1", "kv_KiB");
  for (const EvalResult& r : results) {
    std::fprintf(table, "%-*s %6s %8d %8lld %8d %8d %10.4f %8.4f %9.1f\n", width,
                 r.policy.c_str(), r.kv_dtype.c_str(), r.budget_tokens,
                 static_cast<long long>(r.tokens), r.window, r.windows, r.ppl, r.top1,
                 double(r.kv_bytes) / 1024.0);
    if (json) {
      PrintJsonLine({{"policy", r.policy},
                     {"kv_dtype", r.kv_dtype},
                     {"budget", r.budget_tokens},
                     {"budget_spec", r.budget},
                     {"window", r.window},
                     {"windows", r.windows},
                     {"tokens", r.tokens},
                     {"ppl", Rounded(r.ppl, 6)},
                     {"top1", Rounded(r.top1, 6)},
                     {"kv_bytes", r.kv_bytes}});
    }
  }
  if (!plot_path.empty()) {
    if (absl::Status s = WritePlot(plot_path, results, model_path); !s.ok()) return Fail(s);
    std::fprintf(stderr, "wrote %s\n", plot_path.c_str());
  }
  return 0;
}

}  // namespace heavykv::cli
