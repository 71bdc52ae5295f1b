// Capacity planning: how many sequences one replica's KV pool holds at once, for the full cache
// and for each KV budget, by the same page rules the scheduler admits with (scheduler.h):
//
//   bytes per token    = layers * kv_heads * (SlotKvBytes + 8)          K+V rows: 2 * head_dim * E
//                                                                       for elements of E bytes
//                                                                       (4 fp32, 2 bf16), or int8 /
//                                                                       int4 rows and their scales
//                                                                       (KvShape::SlotKvBytes);
//                                                                       int32 pos and float score
//                                                                       per slot
//   tables             = layers on the CPU (a page holds one layer), 1 on CUDA (every layer)
//   page bytes         = block_size * bytes per token / tables
//   full sequence      : tables * ceil(max_len / block_size) pages
//   bounded (B < L)    : sum over tables of ceil((b_l + 1) / block_size) pages (b_l = B with
//                        uniform layer budgets; PeakPages), plus one shared prefill reserve of
//                        tables * (ceil(max_step_tokens / block_size) + 4) pages while any
//                        bounded one runs
//   sequences          = floor(pages / per sequence)                        (full)
//                      = floor((pages - reserve) / per sequence)            (bounded)
//
// `heavykv plan` prints it; docs/DEPLOY.md explains how to use it to size --kv-pool-mb.
//
//   CapacityPlanInput in{KvShapeFor(config, 16), /*num_pages=*/3584, /*max_len=*/1024};
//   absl::StatusOr<CapacityPlan> plan = PlanCapacity(in, {*KvBudget::Parse("0.2")});
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "memory/eviction_policy.h"
#include "memory/kv_cache.h"

namespace heavykv {

struct CapacityPlanInput {
  KvShape shape;                  // block_size and element_bytes included
  int32_t num_pages = 0;          // the pool (--kv-pages, or --kv-pool-mb / page bytes)
  int32_t max_len = 0;            // tokens per sequence: prompt + max new tokens
  int32_t max_step_tokens = 512;  // SchedulerConfig::max_step_tokens
  int32_t max_running = 64;       // SchedulerConfig::max_running
  EvictGranularity granularity = EvictGranularity::kToken;  // serve's --evict-granularity
  LayerBudgets layers = LayerBudgets::kUniform;              // serve's --layer-budgets
  // Issue 29: the bounded rows' policy keeps its evicted tokens in a demoted store of this type
  // (a policy's demote=, its default budget: as many as it keeps), and every sequence's own row
  // type (a request's kv_dtype; packed pages). kNone: neither.
  KvQuant demote = KvQuant::kNone;
  KvQuant request_quant = KvQuant::kNone;
};

struct CapacityRow {
  KvBudget budget;                 // as given; the full-cache row has value 1 (the whole sequence)
  int32_t tokens_kept = 0;         // per (layer, kv head): the resolved budget, or max_len
  bool bounded = false;            // false when the budget keeps the whole sequence
  int32_t pages_per_sequence = 0;  // what the scheduler reserves for one sequence
  int32_t reserve_pages = 0;       // the shared prefill reserve (bounded rows only)
  int64_t sequences = 0;           // that fit in the pool at once (0: not even one)
  int64_t running = 0;  // min(sequences, max_running, max_step_tokens): what one replica runs
  int64_t pages_for_max_running = 0;  // pool that admits max_running of them at once
};

struct CapacityPlan {
  int64_t bytes_per_token = 0;  // every layer and kv head, metadata included
  int64_t page_bytes = 0;
  int32_t num_pages = 0;
  std::vector<CapacityRow> rows;  // the full cache first, then one per budget, in order
};

// Pages of one sequence of `max_len` tokens whose heads keep `tokens_kept` (>= max_len: full),
// with a demoted store of `demote` and rows of `request_quant` (CapacityPlanInput).
int32_t PagesPerSequence(const KvShape& shape, int32_t max_len, int32_t tokens_kept,
                         EvictGranularity granularity = EvictGranularity::kToken,
                         LayerBudgets layers = LayerBudgets::kUniform,
                         KvQuant demote = KvQuant::kNone,
                         KvQuant request_quant = KvQuant::kNone);
// MiB that hold `pages` pages of `page_bytes`, rounded up so that --kv-pool-mb of it gives at
// least that many pages (`heavykv plan`'s "MiB for N" column).
int64_t PoolMiBForPages(int64_t pages, int64_t page_bytes);
// The scheduler's prefill reserve for bounded sequences.
int32_t PrefillReservePages(const KvShape& shape, int32_t max_step_tokens);

// INVALID_ARGUMENT for a shape, pool, length or limit that is not positive, or a demote or
// request type the pool's pages cannot hold more compactly (CheckPackedFormats).
absl::StatusOr<CapacityPlan> PlanCapacity(const CapacityPlanInput& in,
                                          const std::vector<KvBudget>& budgets);

}  // namespace heavykv
