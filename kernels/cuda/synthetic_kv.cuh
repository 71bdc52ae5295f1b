// Synthetic KV contents for benchmarks and tests: fills slots [0, num_slots) of every (layer, kv
// head) of one block table with deterministic pseudo-random K/V in [-1, 1), positions 0, 1, ...
// and pseudo-random scores in [0, 1), as if the sequence had been prefilled.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_kv.cuh"

namespace heavykv::cuda {

// page_ids [ceil(num_slots / block_size)] in device memory.
cudaError_t FillSyntheticKv(const DeviceKvPool& pool, const int32_t* page_ids, int32_t num_slots,
                            uint64_t seed, cudaStream_t stream);

}  // namespace heavykv::cuda
