// heavykv run: one generation on the CPU or CUDA engine, printed as llama2.c run.c prints it.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/serving/generator.h"
#include "engine/serving/request_validation.h"
#include "engine/gguf/gguf.h"
#include "engine/tokenizer/gguf_tokenizer.h"
#include "engine/runner/step_runner.h"
#include "engine/tokenizer/text_stream.h"
#include "engine/tokenizer/tokenizer.h"
#include "kernels/cpu/gemm.h"
#include "server/flags/cli_flags.h"
#include "server/flags/dtype_flags.h"
#include "server/flags/policy_flags.h"
#include "server/flags/sampling_flags.h"
#include "server/cli/commands.h"
#include "server/cli/host_memory.h"

namespace heavykv::cli {

absl::StatusOr<std::shared_ptr<const TextTokenizer>> LoadOptionalTokenizer(
    const std::string& path, const std::string& model_path, int32_t vocab_size) {
  if (!path.empty()) {
    absl::StatusOr<Tokenizer> t = Tokenizer::Load(path, vocab_size);
    if (!t.ok()) return t.status();
    return std::shared_ptr<const TextTokenizer>(new Tokenizer(*std::move(t)));
  }
  if (!IsGgufFile(model_path)) return nullptr;
  absl::StatusOr<GgufFile> f = GgufFile::Open(model_path);
  if (!f.ok()) return f.status();
  absl::StatusOr<std::unique_ptr<TextTokenizer>> t = LoadGgufTextTokenizer(*f, vocab_size);
  if (absl::IsNotFound(t.status())) return nullptr;
  // Token ids still work: say why text does not, and go on without a tokenizer.
  if (absl::IsUnimplemented(t.status())) {
    std::fprintf(stderr, "note: %s; prompts and output are token ids\n",
                 std::string(t.status().message()).c_str());
    return nullptr;
  }
  if (!t.ok()) return t.status();
  return std::shared_ptr<const TextTokenizer>(*std::move(t));
}

absl::StatusOr<std::vector<int32_t>> PromptTokens(const TextTokenizer* tok,
                                                  const std::string& prompt,
                                                  const ModelConfig& config) {
  if (tok) {
    std::vector<int32_t> ids = tok->Encode(prompt, tok->add_bos(), tok->add_eos());
    if (ids.empty()) return absl::InvalidArgumentError("the prompt is empty");
    return ids;
  }
  std::vector<int32_t> ids;
  for (absl::string_view part : absl::StrSplit(prompt, absl::ByAnyChar(" \t\n,"),
                                              absl::SkipEmpty())) {
    int32_t id;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "without --tokenizer the prompt must be token ids separated by spaces; got \"", part,
          "\""));
    }
    ids.push_back(id);
  }
  ids = PromptWithBos(config, ids);
  if (ids.empty()) return absl::InvalidArgumentError("the prompt is empty");
  return ids;
}

absl::StatusOr<int32_t> PoolPages(const KvShape& shape, int64_t kv_pages, int64_t kv_pool_mb,
                                  int32_t default_pages) {
  if (kv_pages < 0 || kv_pool_mb < 0) {
    return absl::InvalidArgumentError("--kv-pages and --kv-pool-mb must not be negative");
  }
  if (kv_pages > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-pages ", kv_pages, " is too large (at most ", INT32_MAX, ")"));
  }
  // A pool that cannot give every table (every layer, on the CPU) one page runs no sequence:
  // refused at start with the numbers, as the K/V type sets the page's bytes.
  auto too_small = [&](int64_t pages, const std::string& flag) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, " holds ", pages, " pages of ", shape.PageBytes(), " bytes (", shape.block_size,
        " slots of ", KvElementName(shape), " K/V, ",
        shape.table_per_layer ? "one layer" : "every layer", "); one sequence needs at least ",
        shape.NumTables(), " (a page per block table)"));
  };
  if (kv_pages > 0) {
    if (kv_pages < shape.NumTables()) {
      return too_small(kv_pages, absl::StrCat("--kv-pages ", kv_pages));
    }
    return static_cast<int32_t>(kv_pages);
  }
  if (kv_pool_mb > 0) {
    // 2^30 MiB (1 PiB) keeps the shift below from overflowing.
    const int64_t pages =
        kv_pool_mb > (int64_t(1) << 30) ? INT64_MAX : (kv_pool_mb << 20) / shape.PageBytes();
    if (pages > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat("--kv-pool-mb ", kv_pool_mb,
                                                     " is too large for a pool of at most ",
                                                     INT32_MAX, " pages"));
    }
    if (pages < shape.NumTables()) {
      return too_small(pages, absl::StrCat("--kv-pool-mb ", kv_pool_mb));
    }
    return static_cast<int32_t>(pages);
  }
  return default_pages;
}

void SetThreads(int64_t threads) {
  cpu::SetNumThreads(threads > 0 ? static_cast<int>(threads)
                                 : static_cast<int>(std::thread::hardware_concurrency()));
}

int RunCommand(int argc, char** argv) {
  std::string model_path, tokenizer_path, prompt, policy_name = "full", budget_text = "1";
  PolicyDefaultFlags policy_defaults;
  std::string device_name = "cpu";
  DtypeFlags dtypes;
  int64_t steps = 256, top_k = 0, seed = -1, block_size = 16, kv_pages = 0, kv_pool_mb = 0;
  int64_t prefill_chunk = 256, threads = 0;
  double temperature = 1.0, top_p = 0.9, recent_fraction = 0.5;
  bool json = false, ignore_eos = false;
  FlagSet flags("run", "heavykv run --model FILE [--tokenizer FILE] [--prompt TEXT] [flags]");
  flags.String("model", &model_path, "llama2.c checkpoint or GGUF file (required)");
  flags.String("tokenizer", &tokenizer_path,
               "llama2.c tokenizer (default: a GGUF model's own); else prompts and output are ids");
  flags.String("prompt", &prompt, "prompt text (token ids without --tokenizer)");
  flags.Int("steps", &steps,
            "positions to run, prompt included (llama2.c -n); 0 = context length; more than the "
            "context with --policy window or sink (endless streaming)");
  flags.Double("temperature", &temperature, "0 = greedy");
  flags.Double("top-p", &top_p, "nucleus sampling; 1 = off");
  flags.Int("top-k", &top_k, "keep the k most likely tokens; 0 = off");
  flags.Int("seed", &seed, "sampling seed; -1 = from the clock");
  SamplingApiFlags sampling_api;
  sampling_api.Register(flags);
  flags.String("policy", &policy_name,
               "KV policy: full, window, sink, h2o, tova, scissorhands, knorm or snapkv, as "
               "name[:key=value]... (e.g. snapkv:window=32:kernel=7:decode=h2o)");
  flags.String("kv-budget", &budget_text,
               "tokens kept per head: a count, or a fraction of steps (of the context past it)");
  policy_defaults.Register(flags);
  flags.Double("recent-fraction", &recent_fraction,
               "h2o, scissorhands, snapkv: share of the budget kept for recent tokens");
  flags.Int("block-size", &block_size, "token slots per KV page");
  flags.Int("kv-pages", &kv_pages, "KV pool size in pages; 0 = what the sequence needs");
  flags.Int("kv-pool-mb", &kv_pool_mb, "KV pool size in MiB (if --kv-pages is 0)");
  flags.Int("prefill-chunk", &prefill_chunk, "prompt tokens per forward step");
  flags.Int("threads", &threads, "CPU threads; 0 = every core");
  flags.String("device", &device_name, "cpu or cuda: where the weights, KV pool and forward pass run");
  dtypes.Register(flags);
  flags.Bool("ignore-eos", &ignore_eos, "keep generating past end-of-sequence tokens");
  flags.Bool("json", &json, "print one JSON object with text, tokens and timings");
  if (std::optional<int> code = ParseOrExit(flags, argc, argv)) return *code;
  if (model_path.empty()) return Fail(absl::InvalidArgumentError("--model is required"));
  absl::StatusOr<Device> device = ParseDevice(device_name);
  if (!device.ok()) return Fail(device.status());
  if (absl::Status s = dtypes.Resolve(*device); !s.ok()) return Fail(s);
  if (absl::Status s = CheckDevice(*device); !s.ok()) return Fail(s);
  SetThreads(threads);

  absl::StatusOr<Model> model = LoadModel(model_path, dtypes.weights);
  if (!model.ok()) return Fail(model.status());
  const ModelConfig& c = model->config;
  absl::StatusOr<std::shared_ptr<const TextTokenizer>> tok =
      LoadOptionalTokenizer(tokenizer_path, model_path, c.vocab_size);
  if (!tok.ok()) return Fail(tok.status());
  absl::StatusOr<std::vector<int32_t>> ids = PromptTokens(tok->get(), prompt, c);
  if (!ids.ok()) return Fail(ids.status());
  if (steps == 0) steps = c.seq_len;
  // Past the context length only with window or sink (endless streaming): Generate checks.
  if (steps < int64_t(ids->size()) || steps > INT32_MAX) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--steps ", steps, " must be at least ", ids->size(), " (the prompt's tokens)")));
  }
  if (temperature < 0 || !(top_p >= 0 && top_p <= 1) || top_k < 0 || top_k > c.vocab_size) {
    return Fail(absl::InvalidArgumentError(
        "need --temperature >= 0, --top-p in [0, 1], --top-k in [0, vocab size]"));
  }
  // The sampling API's flags, checked and resolved as the engine does a request's.
  GenerationRequest api;
  api.max_new_tokens = static_cast<int32_t>(steps - int64_t(ids->size()) + 1);
  api.ignore_eos = ignore_eos;
  if (absl::Status s = sampling_api.Fill(flags, api); !s.ok()) return Fail(s);
  if (absl::Status s = CheckSamplingApi(api, c.vocab_size); !s.ok()) return Fail(s);
  if (absl::Status s = policy_defaults.Resolve(); !s.ok()) return Fail(s);
  absl::StatusOr<std::unique_ptr<EvictionPolicy>> policy = MakePolicy(
      policy_name, recent_fraction, policy_defaults.granularity, policy_defaults.layers);
  if (!policy.ok()) return Fail(policy.status());
  absl::StatusOr<KvBudget> budget = KvBudget::Parse(budget_text);
  if (!budget.ok()) return Fail(budget.status());
  const bool full = *policy == nullptr;  // the full cache is no policy

  GenerateOptions opt;
  opt.steps = static_cast<int32_t>(steps);
  opt.sampling.temperature = static_cast<float>(temperature);
  opt.sampling.top_p = static_cast<float>(top_p);
  opt.sampling.top_k = static_cast<int32_t>(top_k);
  opt.sampling.seed = seed >= 0 ? uint64_t(seed)
                                : uint64_t(std::chrono::system_clock::now().time_since_epoch().count());
  std::vector<int32_t> end_ids;  // what min_tokens holds back
  if (api.min_tokens > 0) {
    for (int32_t id = 0; id < c.vocab_size; ++id) {
      if (EndsSequence(tok->get(), c, id)) end_ids.push_back(id);
    }
  }
  ResolveSamplingApi(api, end_ids, opt.sampling);
  opt.policy = full ? nullptr : policy->get();
  // A fraction is of the steps, or of the context when the run goes past it.
  opt.budget = full ? kUnboundedBudget : budget->Resolve(std::min(opt.steps, c.seq_len));
  opt.prefill_chunk = static_cast<int32_t>(std::max<int64_t>(1, prefill_chunk));
  opt.tokenizer = tok->get();
  opt.ignore_eos = ignore_eos;

  if (block_size <= 0 || block_size > 1024) {
    return Fail(absl::InvalidArgumentError("--block-size must be in [1, 1024]"));
  }
  const KvShape shape = KvShapeForDevice(*device, c, static_cast<int32_t>(block_size), dtypes.kv);
  // By default just what this sequence needs: its peak (PeakPages: each layer's budget + 1, or
  // every step) plus a prefill chunk per table.
  const int64_t default_pages =
      PeakPages(shape, opt.policy, opt.budget, std::max(1, opt.steps)) +
      int64_t(shape.NumTables()) * ((opt.prefill_chunk + block_size - 1) / block_size);
  absl::StatusOr<int32_t> pages =
      PoolPages(shape, kv_pages, kv_pool_mb,
                static_cast<int32_t>(std::min<int64_t>(INT32_MAX, default_pages)));
  if (!pages.ok()) return Fail(pages.status());
  if (*device == Device::kCpu) {
    if (absl::Status s = CheckHostMemory(int64_t(*pages) * shape.PageBytes(),
                                         absl::StrCat("the KV pool (", *pages, " pages)"));
        !s.ok()) {
      return Fail(s);
    }
  }
  absl::StatusOr<std::unique_ptr<KvCache>> cache = CreateKvCache(*device, shape, *pages);
  if (!cache.ok()) return Fail(cache.status());
  absl::StatusOr<std::unique_ptr<StepRunner>> runner =
      MakeStepRunner(*device, *model, cache->get(), {.gpu_weights = dtypes.gpu_weights});
  if (!runner.ok()) return Fail(runner.status());

  std::string text;
  auto on_token = [&](int32_t prev, int32_t token) {
    std::string piece;
    if (*tok) {
      piece = (*tok)->Decode(prev, token);
      if ((*tok)->run_c_text_rules() && !Tokenizer::IsPrintablePiece(piece)) piece.clear();
    } else {
      piece = absl::StrCat(token, " ");
    }
    text += piece;
    if (!json) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
  };
  absl::StatusOr<GenerateResult> r = Generate(**runner, *ids, opt, on_token);
  if (!r.ok()) {
    if (!json) std::fputc('\n', stdout);
    return Fail(r.status());
  }
  const int32_t completion = static_cast<int32_t>(r->tokens.size()) - r->num_prompt_tokens;
  // The first new token comes from the prefill; the decode steps produced the rest.
  const double tok_s =
      r->decode_seconds > 0 && completion > 1 ? (completion - 1) / r->decode_seconds : 0;
  if (json) {
    PrintJsonLine({{"text", TextStream::Sanitize(text)},
                   {"token_ids", r->tokens},
                   {"prompt_tokens", r->num_prompt_tokens},
                   {"completion_tokens", completion},
                   {"finish_reason", r->finish_reason},
                   {"policy", policy_name},
                   {"kv_budget", full ? -1 : opt.budget},
                   {"peak_pages", r->peak_pages},
                   {"kv_tokens_evicted", r->tokens_evicted},
                   {"seed", uint64_t(opt.sampling.seed)},
                   {"prefill_seconds", Rounded(r->prefill_seconds, 6)},
                   {"decode_seconds", Rounded(r->decode_seconds, 6)},
                   {"decode_cpu_seconds", Rounded(r->decode_cpu_seconds, 6)},
                   {"weight_bytes", model->WeightBytes()},
                   {"device_weights", FormatBytesByFormat((*runner)->DeviceWeightBytes())},
                   {"decode_tokens_per_second", Rounded(tok_s, 2)}});
  } else {
    std::fputc('\n', stdout);
    std::fprintf(stderr, "achieved tok/s: %.1f (policy %s, peak pages %d, evicted %lld)\n", tok_s,
                 policy_name.c_str(), r->peak_pages, static_cast<long long>(r->tokens_evicted));
    if (const auto w = (*runner)->DeviceWeightBytes(); !w.empty()) {
      std::fprintf(stderr, "device weights (--gpu-weights %s): %s\n",
                   std::string(GpuWeightsName(dtypes.gpu_weights)).c_str(),
                   FormatBytesByFormat(w).c_str());
    }
  }
  return 0;
}

}  // namespace heavykv::cli
