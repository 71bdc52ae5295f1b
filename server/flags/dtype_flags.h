// The --weight-dtype and --kv-dtype flags that run, eval and serve share (plan takes --kv-dtype
// alone): registered once, parsed and checked against the device in one place.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "engine/model/model.h"
#include "engine/runner/step_runner.h"
#include "server/flags/cli_flags.h"

namespace heavykv::cli {

struct DtypeFlags {
  std::string weight_name = "auto", kv_name = "auto";
  // Set by Resolve.
  cpu::WeightType weights = cpu::WeightType::kFp32;
  KvDtype kv = KvDtype::kAuto;

  void Register(FlagSet& flags, bool with_weights = true);
  // INVALID_ARGUMENT for an unknown name, or a K/V type `device` cannot hold.
  absl::Status Resolve(Device device);
};

}  // namespace heavykv::cli
