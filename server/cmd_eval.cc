// heavykv eval: perplexity and top-1 agreement of policies x budgets on a text file.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/evaluator.h"
#include "engine/step_runner.h"
#include "server/cli_flags.h"
#include "server/dtype_flags.h"
#include "server/commands.h"

namespace heavykv::cli {

int EvalCommand(int argc, char** argv) {
  std::string model_path, tokenizer_path, text_path, policies = "full,window,sink,h2o";
  std::string budgets = "0.2", device_name = "cpu";
  DtypeFlags dtypes;
  int64_t window = 0, max_windows = 0, block_size = 16, threads = 0;
  double recent_fraction = 0.5;
  bool json = false;
  FlagSet flags("eval", "heavykv eval --model FILE --tokenizer FILE --text FILE [flags]");
  flags.String("model", &model_path, "llama2.c checkpoint or GGUF file (required)");
  flags.String("tokenizer", &tokenizer_path, "llama2.c tokenizer (default: a GGUF model's own); else --text holds ids");
  flags.String("text", &text_path, "stories separated by blank lines (required)");
  flags.Int("window", &window, "tokens per window; 0 = context length");
  flags.Int("max-windows", &max_windows, "windows to evaluate; 0 = all");
  flags.String("policy", &policies, "comma list of KV policies (name[:key=value]...)");
  flags.String("kv-budget", &budgets, "comma list of budgets: token counts or fractions of the window");
  flags.Double("recent-fraction", &recent_fraction,
               "h2o, scissorhands, snapkv: share of the budget kept for recent tokens");
  flags.Int("block-size", &block_size, "token slots per KV page");
  flags.Int("threads", &threads, "CPU threads; 0 = every core");
  flags.String("device", &device_name, "cpu or cuda: where the forward passes run");
  dtypes.Register(flags);
  flags.Bool("json", &json, "JSON lines on stdout (the table goes to stderr)");
  if (std::optional<int> code = ParseOrExit(flags, argc, argv)) return *code;
  if (model_path.empty() || text_path.empty()) {
    return Fail(absl::InvalidArgumentError("--model and --text are required"));
  }
  if (window < 0 || max_windows < 0 || block_size <= 0 || block_size > 1024) {
    return Fail(absl::InvalidArgumentError(
        "--window and --max-windows must be >= 0, --block-size in [1, 1024]"));
  }
  absl::StatusOr<Device> device = ParseDevice(device_name);
  if (!device.ok()) return Fail(device.status());
  if (absl::Status s = dtypes.Resolve(*device); !s.ok()) return Fail(s);
  if (absl::Status s = CheckDevice(*device); !s.ok()) return Fail(s);
  SetThreads(threads);
  absl::StatusOr<Model> model = LoadModel(model_path, dtypes.weights);
  if (!model.ok()) return Fail(model.status());
  absl::StatusOr<std::shared_ptr<const TextTokenizer>> tok =
      LoadOptionalTokenizer(tokenizer_path, model_path, model->config.vocab_size);
  if (!tok.ok()) return Fail(tok.status());
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

  EvalOptions opt;
  opt.window = static_cast<int32_t>(window);
  opt.max_windows = static_cast<int32_t>(max_windows);
  opt.recent_fraction = recent_fraction;
  opt.block_size = static_cast<int32_t>(block_size);
  opt.device = *device;
  opt.kv_dtype = dtypes.kv;
  std::vector<std::string> budget_list = SplitList(budgets);
  if (budget_list.empty()) return Fail(absl::InvalidArgumentError("--kv-budget is empty"));
  for (const std::string& p : SplitList(policies)) {
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
  absl::StatusOr<std::vector<EvalResult>> results = Evaluate(*model, stream, opt);
  if (!results.ok()) return Fail(results.status());

  std::FILE* table = json ? stderr : stdout;
  int width = 8;  // the policy column: as wide as the longest spec ("snapkv:window=16")
  for (const EvalResult& r : *results) width = std::max(width, static_cast<int>(r.policy.size()));
  std::fprintf(table, "%-*s %8s %8s %8s %8s %10s %8s\n", width, "policy", "budget", "tokens",
               "window", "windows", "ppl", "top1");
  for (const EvalResult& r : *results) {
    std::fprintf(table, "%-*s %8d %8lld %8d %8d %10.4f %8.4f\n", width, r.policy.c_str(),
                 r.budget_tokens, static_cast<long long>(r.tokens), r.window, r.windows, r.ppl,
                 r.top1);
    if (json) {
      PrintJsonLine({{"policy", r.policy},
                     {"budget", r.budget_tokens},
                     {"budget_spec", r.budget},
                     {"window", r.window},
                     {"windows", r.windows},
                     {"tokens", r.tokens},
                     {"ppl", Rounded(r.ppl, 6)},
                     {"top1", Rounded(r.top1, 6)}});
    }
  }
  return 0;
}

}  // namespace heavykv::cli
