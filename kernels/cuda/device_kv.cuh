// The plain views CUDA kernels see: the KV pool in device memory and one step's plan. Kernels get
// ids and offsets (FlashInfer's paged_kv_t: indptr / indices), never allocator objects; the
// engine (engine/cuda) builds the plan from the host-side KvCache block tables every step.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace heavykv::cuda {

using bf16 = __nv_bfloat16;

// The whole pool, in KvCache's page layout (memory/kv_cache.h), with bf16 K/V:
//   kv    [num_pages][num_layers][num_kv_heads][2][block_size][head_dim]  bf16, K rows then V
//   pos   [num_pages][num_layers][num_kv_heads][block_size]               int32 position held
//   score [num_pages][num_layers][num_kv_heads][block_size]               fp32 H2O score
// A page's K rows of one (layer, head) are contiguous (block_size * head_dim elements).
struct DeviceKvPool {
  bf16* kv = nullptr;
  int32_t* pos = nullptr;
  float* score = nullptr;
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 16;

  __host__ __device__ int64_t PageElems() const {
    return int64_t(num_layers) * num_kv_heads * 2 * block_size * head_dim;
  }
  __host__ __device__ int64_t PageMeta() const {
    return int64_t(num_layers) * num_kv_heads * block_size;
  }
  // First element of K (which = 0) or V (which = 1) row `row` of (page, layer, head).
  __host__ __device__ int64_t RowOffset(int32_t page, int32_t layer, int32_t head, int32_t which,
                                        int32_t row) const {
    return int64_t(page) * PageElems() +
           ((int64_t(layer) * num_kv_heads + head) * 2 + which) * block_size * head_dim +
           int64_t(row) * head_dim;
  }
  // Entry of slot `row` of (page, layer, head) in pos / score.
  __host__ __device__ int64_t MetaOffset(int32_t page, int32_t layer, int32_t head,
                                         int32_t row) const {
    return int64_t(page) * PageMeta() + (int64_t(layer) * num_kv_heads + head) * block_size + row;
  }
};

// One forward step over `num_seqs` sequences and `num_tokens` token rows, all arrays in device
// memory. Sequence i appends rows [token_begin[i], token_begin[i] + num_new[i]) of the step at
// slots [num_old[i], num_old[i] + num_new[i]) and positions start_pos[i] + 0, 1, ...; its block
// table is page_ids[page_indptr[i] .. page_indptr[i + 1]) and covers num_old + num_new slots.
struct DeviceStep {
  int32_t num_seqs = 0;
  int32_t num_tokens = 0;
  const int32_t* page_indptr = nullptr;  // [num_seqs + 1]
  const int32_t* page_ids = nullptr;     // [page_indptr[num_seqs]]
  const int32_t* num_old = nullptr;      // [num_seqs]
  const int32_t* num_new = nullptr;      // [num_seqs]
  const int32_t* token_begin = nullptr;  // [num_seqs]
  const int32_t* start_pos = nullptr;    // [num_seqs]
  const int32_t* token_seq = nullptr;    // [num_tokens] the sequence of each token row
  const int32_t* token_pos = nullptr;    // [num_tokens] the position of each token row
  // Per sequence: 1 when attention adds each slot's probability to its score (h2o).
  const int32_t* accumulate = nullptr;   // [num_seqs]
  // Eviction (kernels/cuda/eviction_rule.h): tokens kept per head, rule and its parameter.
  const int32_t* budget = nullptr;       // [num_seqs]
  const int32_t* evict_kind = nullptr;   // [num_seqs] EvictKind
  const int32_t* evict_param = nullptr;  // [num_seqs]
};

}  // namespace heavykv::cuda
