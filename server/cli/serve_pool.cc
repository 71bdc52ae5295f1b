#include "server/cli/serve_pool.h"

#include <algorithm>
#include <climits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/serving/capacity_plan.h"
#include "server/cli/commands.h"
#include "server/cli/host_memory.h"

namespace heavykv::cli {
namespace {

std::string GiB(int64_t bytes) { return absl::StrFormat("%.1f GiB", double(bytes) / (1 << 30)); }

int64_t PagesPerContext(const ServePoolRequest& req) {
  return PagesPerSequence(req.shape, req.context, req.context);
}

// `heavykv plan`'s input for this server: its shape, context and limits over `pages`.
CapacityPlanInput PlanInput(const ServePoolRequest& req, int32_t pages) {
  CapacityPlanInput in;
  in.shape = req.shape;
  in.num_pages = std::max(pages, 1);
  in.max_len = req.context;
  in.max_step_tokens = static_cast<int32_t>(req.max_step_tokens);
  in.max_running = static_cast<int32_t>(req.max_running);
  return in;
}

absl::Status WithHint(const ServePoolRequest& req, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(message, "; ", ServePoolHint(req)));
}

}  // namespace

std::string ServePoolHint(const ServePoolRequest& req) {
  std::string figure;
  if (absl::StatusOr<CapacityPlan> plan = PlanCapacity(PlanInput(req, 1), {}); plan.ok()) {
    figure = absl::StrCat(
        "`heavykv plan --model ", req.model_path, " --max-len ", req.context, " --max-running ",
        req.max_running, "` gives --kv-pool-mb ",
        PoolMiBForPages(plan->rows[0].pages_for_max_running, plan->page_bytes), " for ",
        req.max_running, " full contexts of ", req.context, " tokens; ");
  }
  return absl::StrCat(figure,
                      "size the pool with --kv-memory-fraction (share of the memory left after "
                      "the weights; default 0.5), --kv-pool-mb or --kv-pages, or need less with "
                      "--max-model-len (context) and --max-running (sequences)");
}

absl::StatusOr<ServePool> SizeServePool(const ServePoolRequest& req) {
  if (req.kv_pages < 0 || req.kv_pool_mb < 0) {
    return absl::InvalidArgumentError("--kv-pages and --kv-pool-mb must not be negative");
  }
  const bool cpu = req.host_pool;
  const int64_t cap = req.max_running * PagesPerContext(req);  // more is never used
  ServePool pool;
  int64_t default_pages = std::min<int64_t>(cap, INT32_MAX);
  if (!cpu) {
    default_pages = req.device_default_pages.value_or(default_pages);
    pool.sized_by = "the free GPU memory after the weights and a reserve";
  } else if (req.kv_pages == 0 && req.kv_pool_mb == 0 && req.available_after_weights) {
    const int64_t bytes = static_cast<int64_t>(
        req.memory_fraction * double(std::max<int64_t>(0, *req.available_after_weights)));
    const int64_t fit = bytes / req.shape.PageBytes();
    default_pages = std::min<int64_t>({fit, cap, INT32_MAX});
    pool.sized_by = absl::StrCat(
        "--kv-memory-fraction ", req.memory_fraction, " of ",
        GiB(*req.available_after_weights), " available after the weights",
        fit > cap ? absl::StrCat(", capped at --max-running ", req.max_running, " full contexts")
                  : "");
    if (default_pages < req.shape.NumTables()) {
      return WithHint(req, absl::StrCat("the KV pool from ", pool.sized_by, " is ",
                                        GiB(bytes), ": not one page per block table (",
                                        req.shape.NumTables(), " pages of ",
                                        req.shape.PageBytes(), " bytes)"));
    }
  } else if (req.kv_pages == 0 && req.kv_pool_mb == 0) {
    pool.sized_by = absl::StrCat("--max-running ", req.max_running,
                                 " full contexts (the host's available memory is unknown)");
  }
  absl::StatusOr<int32_t> pages =
      PoolPages(req.shape, req.kv_pages, req.kv_pool_mb, static_cast<int32_t>(default_pages));
  if (!pages.ok()) return WithHint(req, pages.status().message());
  if (req.kv_pages > 0) {
    pool.sized_by = absl::StrCat("--kv-pages ", req.kv_pages);
  } else if (req.kv_pool_mb > 0) {
    pool.sized_by = absl::StrCat("--kv-pool-mb ", req.kv_pool_mb);
  }
  // A size given in flags is checked against the host's memory; the fraction is of it already.
  if (cpu && (req.kv_pages > 0 || req.kv_pool_mb > 0)) {
    if (absl::Status s = CheckHostMemory(int64_t(*pages) * req.shape.PageBytes(),
                                         absl::StrCat("the KV pool (", *pages, " pages, from ",
                                                      pool.sized_by, ")"));
        !s.ok()) {
      return WithHint(req, s.message());
    }
  }
  pool.pages = *pages;
  pool.tokens = int64_t(*pages) * req.shape.block_size / req.shape.NumTables();
  if (absl::StatusOr<CapacityPlan> plan = PlanCapacity(PlanInput(req, *pages), {}); plan.ok()) {
    pool.sequences = plan->rows[0].sequences;
  }
  return pool;
}

std::string DescribeServePool(const ServePoolRequest& req, const ServePool& pool) {
  return absl::StrFormat(
      "%d pages x %d tokens (%.1f MiB): %d tokens, %d full-length sequences of %d tokens; sized "
      "by %s",
      pool.pages, req.shape.block_size,
      double(req.shape.PageBytes()) * pool.pages / (1 << 20), pool.tokens, pool.sequences,
      req.context, pool.sized_by);
}

}  // namespace heavykv::cli
