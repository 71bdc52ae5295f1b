#include "engine/runner/step_runner.h"

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/runner/model_runner.h"
#if defined(HEAVYKV_HAS_CUDA)
#include <dlfcn.h>
#endif

namespace heavykv {
namespace {

#if defined(HEAVYKV_HAS_CUDA)
// The CUDA backend module (engine/cuda/cuda_backend.cc), loaded once, on first use.
struct CudaBackend {
  void (*check)(absl::Status*) = nullptr;
  void (*default_pages)(const Model*, const KvShape*, const StepRunnerOptions*,
                        absl::StatusOr<int32_t>*) = nullptr;
  void (*make_runner)(const Model*, KvCache*, const StepRunnerOptions*,
                      absl::StatusOr<std::unique_ptr<StepRunner>>*) = nullptr;
  std::string error;  // why it could not be loaded
};

const CudaBackend& Cuda() {
  static CudaBackend b;
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<std::string> paths;
    if (const char* env = std::getenv("HEAVYKV_CUDA_BACKEND"); env != nullptr && *env) {
      paths.push_back(env);
    }
    paths.push_back(HEAVYKV_CUDA_BACKEND_PATH);
    paths.push_back("libheavykv_cuda.so");
    void* so = nullptr;
    for (const std::string& p : paths) {
      if ((so = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
      const char* e = dlerror();
      absl::StrAppend(&b.error, b.error.empty() ? "" : "; ", e != nullptr ? e : p);
    }
    if (so == nullptr) return;
    b.check = reinterpret_cast<decltype(b.check)>(dlsym(so, "HeavykvCudaCheckDevice"));
    b.default_pages =
        reinterpret_cast<decltype(b.default_pages)>(dlsym(so, "HeavykvCudaDefaultKvPagesV2"));
    b.make_runner = reinterpret_cast<decltype(b.make_runner)>(dlsym(so, "HeavykvCudaMakeRunnerV2"));
    if (b.check == nullptr || b.default_pages == nullptr || b.make_runner == nullptr) {
      b.check = nullptr;
      b.error = "the CUDA backend module lacks its entry points";
    }
  });
  return b;
}
#endif

}  // namespace

absl::StatusOr<Device> ParseDevice(absl::string_view name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device \"", name, "\"; choose cpu or cuda"));
}

absl::string_view DeviceName(Device device) { return device == Device::kCuda ? "cuda" : "cpu"; }

bool BuiltWithCuda() {
#if defined(HEAVYKV_HAS_CUDA)
  return true;
#else
  return false;
#endif
}

absl::Status CheckDevice(Device device) {
  if (device == Device::kCpu) return absl::OkStatus();
#if defined(HEAVYKV_HAS_CUDA)
  const CudaBackend& b = Cuda();
  if (b.check == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device cuda: cannot load the CUDA backend (", b.error, ")"));
  }
  absl::Status s;
  b.check(&s);
  return s;
#else
  return absl::FailedPreconditionError(
      "--device cuda: this heavykv was built without CUDA (configure with -DHEAVYKV_CUDA=ON on a "
      "machine with the CUDA toolkit), use --device cpu");
#endif
}

absl::StatusOr<GpuWeights> ParseGpuWeights(absl::string_view name) {
  if (name == "bf16") return GpuWeights::kBf16;
  if (name == "quantized") return GpuWeights::kQuantized;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown --gpu-weights \"", name, "\"; choose ", kGpuWeightsNames));
}

absl::string_view GpuWeightsName(GpuWeights weights) {
  return weights == GpuWeights::kQuantized ? "quantized" : "bf16";
}

absl::Status CheckGpuWeights(Device device, GpuWeights weights) {
  if (device == Device::kCpu && weights == GpuWeights::kQuantized) {
    return absl::InvalidArgumentError(
        "--gpu-weights quantized is for --device cuda (the CPU always keeps a GGUF file's "
        "quantized matrices as its blocks)");
  }
  return absl::OkStatus();
}

std::string FormatBytesByFormat(const std::vector<std::pair<std::string, int64_t>>& by_format) {
  std::string out;
  for (const auto& [name, bytes] : by_format) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", name, " ",
                    absl::StrFormat("%.1f MiB", double(bytes) / (1 << 20)));
  }
  return out;
}

absl::StatusOr<KvDtype> ParseKvDtype(absl::string_view name) {
  if (name == "auto") return KvDtype::kAuto;
  if (name == "fp32") return KvDtype::kFp32;
  if (name == "bf16") return KvDtype::kBf16;
  if (name == "int8") return KvDtype::kInt8;
  if (name == "int4") return KvDtype::kInt4;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown KV dtype \"", name, "\"; choose ", kKvDtypeNames));
}

absl::Status CheckKvDtype(Device device, KvDtype dtype) {
  if (device == Device::kCuda && dtype == KvDtype::kFp32) {
    return absl::InvalidArgumentError(
        "--kv-dtype fp32 with --device cuda: the CUDA backend stores K/V in bf16 (use auto or "
        "bf16)");
  }
  if (device == Device::kCuda && (dtype == KvDtype::kInt8 || dtype == KvDtype::kInt4)) {
    return absl::UnimplementedError(absl::StrCat(
        "--kv-dtype ", KvDtypeName(device, dtype),
        " with --device cuda: quantized K/V pages run on the CPU backend only (use auto or bf16 "
        "on cuda)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<KvDtype> ResolveKvDtype(Device device, absl::string_view name) {
  absl::StatusOr<KvDtype> dtype = ParseKvDtype(name);
  if (!dtype.ok()) return dtype.status();
  if (absl::Status s = CheckKvDtype(device, *dtype); !s.ok()) return s;
  return *dtype;
}

namespace {
bool StoresBf16(Device device, KvDtype dtype) {
  return dtype == KvDtype::kBf16 || (dtype == KvDtype::kAuto && device == Device::kCuda);
}
}  // namespace

absl::string_view KvDtypeName(Device device, KvDtype dtype) {
  if (dtype == KvDtype::kInt8) return "int8";
  if (dtype == KvDtype::kInt4) return "int4";
  return StoresBf16(device, dtype) ? "bf16" : "fp32";
}

KvShape KvShapeForDevice(Device device, const ModelConfig& config, int32_t block_size,
                         KvDtype dtype) {
  KvShape s = KvShapeFor(config, block_size);
  s.element_bytes = StoresBf16(device, dtype) ? 2 : 4;
  s.quant = dtype == KvDtype::kInt8   ? KvQuant::kInt8
            : dtype == KvDtype::kInt4 ? KvQuant::kInt4
                                      : KvQuant::kNone;
  // The CUDA kernels address one table for all layers (kernels/cuda/device_kv.cuh).
  s.table_per_layer = device == Device::kCpu;
  return s;
}

absl::StatusOr<int32_t> DefaultKvPages(Device device, const Model& model, const KvShape& shape,
                                       const StepRunnerOptions& options) {
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  if (absl::Status s = CheckGpuWeights(device, options.gpu_weights); !s.ok()) return s;
  if (device == Device::kCpu) {
    return absl::UnimplementedError("the CPU pool is sized by its caller");
  }
#if defined(HEAVYKV_HAS_CUDA)
  absl::StatusOr<int32_t> pages;
  Cuda().default_pages(&model, &shape, &options, &pages);
  return pages;
#else
  return absl::InternalError("unreachable");
#endif
}

absl::StatusOr<std::unique_ptr<KvCache>> CreateKvCache(Device device, const KvShape& shape,
                                                       int32_t num_pages) {
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  return KvCache::Create(shape, num_pages,
                         device == Device::kCuda ? KvStorage::kExternal : KvStorage::kHost);
}

absl::StatusOr<std::unique_ptr<StepRunner>> MakeStepRunner(Device device, const Model& model,
                                                           KvCache* cache,
                                                           const StepRunnerOptions& options) {
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  if (absl::Status s = CheckGpuWeights(device, options.gpu_weights); !s.ok()) return s;
  const bool external = cache->storage() == KvStorage::kExternal;
  if (external != (device == Device::kCuda)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the KV cache was not created for --device ", DeviceName(device), " (CreateKvCache)"));
  }
  if (device == Device::kCpu) return std::unique_ptr<StepRunner>(new ModelRunner(model, cache));
  // The CUDA runner takes every architecture, rope and norm setting the CPU one does; what its
  // kernels cannot take (head_dim, query heads per kv head) it refuses in Create, naming the
  // limit.
#if defined(HEAVYKV_HAS_CUDA)
  absl::StatusOr<std::unique_ptr<StepRunner>> runner;
  Cuda().make_runner(&model, cache, &options, &runner);
  return runner;
#else
  return absl::InternalError("unreachable");
#endif
}

}  // namespace heavykv
