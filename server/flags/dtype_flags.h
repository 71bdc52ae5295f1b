// The --weight-dtype, --gpu-weights and --kv-dtype flags that run, eval and serve share (plan
// takes --kv-dtype alone): registered once, parsed and checked against the device in one place.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "engine/model/model.h"
#include "engine/runner/step_runner.h"
#include "server/flags/cli_flags.h"

namespace heavykv::cli {

struct DtypeFlags {
  std::string weight_name = "auto", kv_name = "auto", gpu_weights_name = "bf16";
  // Set by Resolve.
  cpu::WeightType weights = cpu::WeightType::kFp32;
  KvDtype kv = KvDtype::kAuto;
  GpuWeights gpu_weights = GpuWeights::kBf16;

  void Register(FlagSet& flags, bool with_weights = true);
  // INVALID_ARGUMENT for an unknown name, a K/V type `device` cannot hold, or --gpu-weights
  // quantized off CUDA.
  absl::Status Resolve(Device device);
};

}  // namespace heavykv::cli
