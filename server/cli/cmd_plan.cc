// heavykv plan: how many sequences one replica's KV pool holds, for the full cache and for each
// KV budget, by the scheduler's admission rules (engine/serving/capacity_plan.h), and the
// --kv-pool-mb that runs --max-running of them. docs/DEPLOY.md walks through it.
#include <algorithm>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/serving/capacity_plan.h"
#include "engine/model/make_model.h"
#include "engine/runner/step_runner.h"
#include "server/flags/cli_flags.h"
#include "server/flags/dtype_flags.h"
#include "server/flags/policy_flags.h"
#include "server/cli/commands.h"

namespace heavykv::cli {
namespace {

std::string BudgetText(const CapacityRow& row, size_t index) {
  return index == 0 ? "full" : row.budget.ToString();
}

}  // namespace

int PlanCommand(int argc, char** argv) {
  std::string model_path, shape_name, budgets = "0.1,0.2,0.5", device_name = "cpu";
  std::string demote, request_dtype;
  DtypeFlags dtypes;
  int64_t layers = 0, kv_heads = 0, head_dim = 0, seq_len = 0, block_size = 16;
  int64_t kv_pages = 0, kv_pool_mb = 0, max_len = 0, max_step_tokens = 512, max_running = 64;
  bool json = false;
  PolicyDefaultFlags policy_defaults;
  FlagSet flags("plan",
                absl::StrCat("heavykv plan (--model FILE | --shape NAME | --layers N --kv-heads N "
                             "--head-dim N --seq-len N) [--kv-pool-mb MIB | --kv-pages N] "
                             "[--kv-budget LIST] [flags]\nshapes: ",
                             NamedShapeList()));
  flags.String("model", &model_path, "llama2.c checkpoint or GGUF file (only its header is read)");
  flags.String("shape", &shape_name, "named model shape; the dimension flags override its fields");
  flags.Int("layers", &layers, "transformer layers");
  flags.Int("kv-heads", &kv_heads, "kv heads");
  flags.Int("head-dim", &head_dim, "dimension of one attention head");
  flags.Int("seq-len", &seq_len, "the model's context length");
  flags.String("device", &device_name, "cpu (fp32 K/V) or cuda (bf16 K/V), as serve's --device");
  dtypes.Register(flags, /*with_weights=*/false);
  flags.Int("block-size", &block_size, "token slots per KV page (as serve's --block-size)");
  flags.Int("kv-pool-mb", &kv_pool_mb, "KV memory per replica in MiB (as serve's --kv-pool-mb)");
  flags.Int("kv-pages", &kv_pages,
            "KV pool in pages instead; neither: --max-running full contexts");
  flags.Int("max-len", &max_len, "tokens per sequence, prompt + new tokens; 0 = --seq-len");
  flags.String("kv-budget", &budgets,
               "comma list of budgets: token counts or fractions of --max-len");
  flags.Int("max-step-tokens", &max_step_tokens, "as serve's --max-step-tokens");
  flags.Int("max-running", &max_running, "as serve's --max-running");
  policy_defaults.Register(flags);
  flags.String("demote", &demote,
               "int8 or int4: the bounded rows' policy keeps its evicted tokens in a demoted store "
               "of that type (demote=, MiKV; its default budget); empty: dropped");
  flags.String("request-kv-dtype", &request_dtype,
               "int8 or int4: every request asks for its own K/V type (kv_dtype, packed pages of "
               "the pool); empty: the pool's");
  flags.Bool("json", &json, "print one JSON object instead of the table");
  if (std::optional<int> code = ParseOrExit(flags, argc, argv)) return *code;
  if (!flags.positional().empty()) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("unexpected argument \"", flags.positional()[0], "\"")));
  }

  // The KV shape: a checkpoint's header, a named shape, then explicit overrides.
  std::string name = "custom";
  int32_t layers_v = 0, kv_heads_v = 0, head_dim_v = 0, seq_len_v = 0;
  if (!model_path.empty() || !shape_name.empty()) {
    absl::StatusOr<ModelConfig> c =
        model_path.empty() ? NamedShape(shape_name) : ReadModelConfig(model_path);
    if (!c.ok()) return Fail(c.status());
    name = model_path.empty() ? shape_name : model_path;
    layers_v = c->num_layers;
    kv_heads_v = c->num_kv_heads;
    head_dim_v = c->head_dim();
    seq_len_v = c->seq_len;
  }
  for (auto [flag, v, dst] : {std::tuple{"layers", layers, &layers_v},
                              {"kv-heads", kv_heads, &kv_heads_v},
                              {"head-dim", head_dim, &head_dim_v},
                              {"seq-len", seq_len, &seq_len_v}}) {
    if (v < 0 || v > (1 << 24)) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("--", flag, " is out of range")));
    }
    if (v > 0) *dst = static_cast<int32_t>(v);
    if (*dst == 0) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--", flag, " is needed (or --model FILE or --shape NAME)")));
    }
  }
  if (block_size < 1 || block_size > 1024 || max_len < 0 || max_len > seq_len_v ||
      max_step_tokens < 1 || max_step_tokens > (1 << 20) || max_running < 1 ||
      max_running > (1 << 16)) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--block-size must be in [1, 1024], --max-len in [0, ", seq_len_v,
                     "], --max-step-tokens in [1, 1048576], --max-running in [1, 65536]")));
  }

  absl::StatusOr<Device> device = ParseDevice(device_name);
  if (!device.ok()) return Fail(device.status());
  if (absl::Status s = dtypes.Resolve(*device); !s.ok()) return Fail(s);
  if (*device == Device::kCuda && kv_pages == 0 && kv_pool_mb == 0) {
    return Fail(absl::InvalidArgumentError(
        "with --device cuda, give --kv-pool-mb: the GPU memory left for the KV pool (serve's "
        "default is the free memory minus the weights and a reserve, which only a GPU knows)"));
  }
  ModelConfig config;
  config.dim = head_dim_v;  // one head of head_dim_v: only the KV shape matters here
  config.num_heads = 1;
  config.num_layers = layers_v;
  config.num_kv_heads = kv_heads_v;
  CapacityPlanInput in;
  in.shape = KvShapeForDevice(*device, config, static_cast<int32_t>(block_size), dtypes.kv);
  in.max_len = max_len > 0 ? static_cast<int32_t>(max_len) : seq_len_v;
  in.max_step_tokens = static_cast<int32_t>(max_step_tokens);
  in.max_running = static_cast<int32_t>(max_running);
  if (absl::Status s = policy_defaults.Resolve(); !s.ok()) return Fail(s);
  in.granularity = policy_defaults.granularity;
  in.layers = policy_defaults.layers;
  for (auto [flag, text, dst] : {std::tuple{"demote", &demote, &in.demote},
                                 {"request-kv-dtype", &request_dtype, &in.request_quant}}) {
    if (!text->empty() && !ParseKvQuant(*text, dst)) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--", flag, " must be int8 or int4, got \"", *text, "\"")));
    }
  }
  // serve's default pool: --max-running contexts of the model's full length.
  const int64_t default_pages =
      max_running * in.shape.NumTables() * ((seq_len_v + block_size - 1) / block_size);
  absl::StatusOr<int32_t> pages =
      PoolPages(in.shape, kv_pages, kv_pool_mb,
                static_cast<int32_t>(std::min<int64_t>(INT32_MAX, default_pages)));
  if (!pages.ok()) return Fail(pages.status());
  in.num_pages = *pages;
  std::vector<KvBudget> budget_list;
  for (const std::string& b : SplitList(budgets)) {
    absl::StatusOr<KvBudget> kb = KvBudget::Parse(b);
    if (!kb.ok()) return Fail(kb.status());
    budget_list.push_back(*kb);
  }
  absl::StatusOr<CapacityPlan> plan = PlanCapacity(in, budget_list);
  if (!plan.ok()) return Fail(plan.status());
  const double pool_mib = double(plan->page_bytes) * plan->num_pages / (1 << 20);
  const int32_t reserve = PrefillReservePages(in.shape, in.max_step_tokens);

  if (json) {
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    for (size_t i = 0; i < plan->rows.size(); ++i) {
      const CapacityRow& r = plan->rows[i];
      rows.push_back({{"budget", BudgetText(r, i)},
                      {"tokens_kept", r.tokens_kept},
                      {"bounded", r.bounded},
                      {"pages_per_sequence", r.pages_per_sequence},
                      {"reserve_pages", r.reserve_pages},
                      {"sequences", r.sequences},
                      {"running", r.running},
                      {"pages_for_max_running", r.pages_for_max_running},
                      {"pool_mb_for_max_running",
                       PoolMiBForPages(r.pages_for_max_running, plan->page_bytes)}});
    }
    PrintJsonLine({{"model", name},
                   {"device", device_name},
                   {"layers", layers_v},
                   {"kv_heads", kv_heads_v},
                   {"head_dim", head_dim_v},
                   {"kv_dtype", KvElementName(in.shape)},
                   {"demote", demote},
                   {"request_kv_dtype", request_dtype},
                   {"slot_kv_bytes", in.shape.SlotKvBytes()},
                   {"block_size", in.shape.block_size},
                   {"max_len", in.max_len},
                   {"bytes_per_token", plan->bytes_per_token},
                   {"page_bytes", plan->page_bytes},
                   {"pages", plan->num_pages},
                   {"pool_mb", Rounded(pool_mib, 1)},
                   {"max_step_tokens", in.max_step_tokens},
                   {"max_running", in.max_running},
                   {"rows", std::move(rows)}});
    return 0;
  }

  std::printf("model %s: %d layers, %d kv heads, head_dim %d; sequences of %d tokens; %s\n",
              name.c_str(), layers_v, kv_heads_v, head_dim_v, in.max_len, device_name.c_str());
  std::printf(
      "bytes per token %lld = %d layers x %d kv heads x (%lld B K+V of head_dim %d in %s + 8 B "
      "pos/score)\n",
      static_cast<long long>(plan->bytes_per_token), layers_v, kv_heads_v,
      static_cast<long long>(in.shape.SlotKvBytes()), head_dim_v, KvElementName(in.shape));
  std::printf("page of %d tokens of %s %lld bytes; pool %d pages = %.1f MiB\n",
              in.shape.block_size, in.shape.table_per_layer ? "one layer" : "every layer",
              static_cast<long long>(plan->page_bytes), plan->num_pages, pool_mib);
  if (in.request_quant != KvQuant::kNone) {
    std::printf("requests ask for %s rows: packed pages of %d tokens (--request-kv-dtype)\n",
                request_dtype.c_str(), PackedBlockSize(in.shape, in.request_quant));
  }
  if (in.demote != KvQuant::kNone) {
    std::printf("bounded rows keep their evicted tokens as %s, as many as they keep (--demote): "
                "packed pages of %d tokens\n",
                demote.c_str(), PackedBlockSize(in.shape, in.demote));
  }
  std::printf("bounded sequences share a prefill reserve of %d pages (--max-step-tokens %d)\n\n",
              reserve, in.max_step_tokens);
  const std::string mib_header = absl::StrCat("MiB for ", in.max_running);
  std::printf("%-8s %10s %10s %10s %8s %12s\n", "budget", "kept/head", "pages/seq", "sequences",
              "running", mib_header.c_str());
  for (size_t i = 0; i < plan->rows.size(); ++i) {
    const CapacityRow& r = plan->rows[i];
    std::printf("%-8s %10d %10d %10lld %8lld %12lld\n", BudgetText(r, i).c_str(), r.tokens_kept,
                r.pages_per_sequence, static_cast<long long>(r.sequences),
                static_cast<long long>(r.running),
                static_cast<long long>(PoolMiBForPages(r.pages_for_max_running, plan->page_bytes)));
  }
  std::printf(
      "\nsequences: that fit in the pool at once; running: at most --max-running (and\n"
      "--max-step-tokens) of them; MiB for %d: the --kv-pool-mb that admits --max-running.\n",
      in.max_running);
  return 0;
}

}  // namespace heavykv::cli
