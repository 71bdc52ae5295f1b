// How `serve` sizes its KV pool (docs/ARCHITECTURE.md, "KV pool sizing"): --kv-pages, else
// --kv-pool-mb, else on the CPU --kv-memory-fraction of the host memory available after the
// weights, capped at --max-running full contexts (more could never be used); on CUDA the free GPU
// memory (DefaultKvPages). Every error names the flags that change the pool and the --kv-pool-mb
// that `heavykv plan` gives for --max-running full contexts.
//
//   ServePoolRequest req{.shape = shape, .context = c.seq_len, ...};
//   absl::StatusOr<ServePool> pool = SizeServePool(req);
//   spdlog::info("KV pool: {}", DescribeServePool(req, *pool));
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "memory/kv_cache.h"

namespace heavykv::cli {

struct ServePoolRequest {
  KvShape shape;
  int32_t context = 0;  // tokens per sequence: the model's context, or --max-model-len
  int64_t max_running = 64;
  int64_t max_step_tokens = 512;
  int64_t kv_pages = 0;    // --kv-pages; 0: not given
  int64_t kv_pool_mb = 0;  // --kv-pool-mb; 0: not given
  double memory_fraction = 0.5;  // --kv-memory-fraction (CPU)
  // Host memory available before the model loaded, minus the bytes the model holds; nullopt
  // when unknown (then the default is --max-running full contexts).
  std::optional<int64_t> available_after_weights;
  // False on CUDA: the pool is device memory, neither the fraction nor the host check applies.
  bool host_pool = true;
  // Pages the device chose when no flag sized the pool (CUDA's DefaultKvPages).
  std::optional<int32_t> device_default_pages;
  std::string model_path;  // for the `heavykv plan` command the errors quote
};

struct ServePool {
  int32_t pages = 0;
  std::string sized_by;    // e.g. "--kv-memory-fraction 0.5 of 21.3 GiB available after ..."
  int64_t tokens = 0;      // token slots of every layer and kv head: pages x block size / tables
  int64_t sequences = 0;   // full-length sequences (of `context` tokens) it holds at once
};

// The pool for `req`; INVALID_ARGUMENT (with the flags and plan's figure) when it cannot give
// every block table a page, or an explicit size exceeds 0.9 of the host memory (CPU).
absl::StatusOr<ServePool> SizeServePool(const ServePoolRequest& req);

// "N pages x B tokens (X MiB): T tokens, S full-length sequences of L tokens; sized by ..."
std::string DescribeServePool(const ServePoolRequest& req, const ServePool& pool);

// What to change, appended to a pool error: the flags and `heavykv plan`'s --kv-pool-mb for
// --max-running full contexts of `req.context` tokens.
std::string ServePoolHint(const ServePoolRequest& req);

}  // namespace heavykv::cli
