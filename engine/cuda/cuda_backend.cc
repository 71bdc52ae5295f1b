// The entry points of the CUDA backend module (libheavykv_cuda.so), which
// engine/runner/step_runner.cc loads with dlopen the first time a caller asks for Device::kCuda.
// Keeping the CUDA runtime out of the executables' link line keeps its thread-local storage out of
// every thread's static TLS block: the metrics server's 100 KiB civetweb threads hold OpenBLAS's 60
// KiB already, and binaries that never use the GPU should not pay for it (nor need libcudart to
// start).
//
// Everything else in the module has hidden visibility; it carries private copies of the few
// memory/ and kernels/cpu/ functions the runner calls (KvCache, PageAllocator, PackedMatrix),
// which act on the caller's objects exactly as the caller's own copies would (same sources).
#include "engine/cuda/cuda_model_runner.h"

#define HEAVYKV_CUDA_EXPORT extern "C" __attribute__((visibility("default")))

HEAVYKV_CUDA_EXPORT void HeavykvCudaCheckDevice(absl::Status* out) {
  *out = heavykv::CheckCudaDevice();
}

// V2: with the StepRunnerOptions (a module of the old signature is refused by name, not called
// with the wrong arguments).
HEAVYKV_CUDA_EXPORT void HeavykvCudaDefaultKvPagesV2(const heavykv::Model* model,
                                                     const heavykv::KvShape* shape,
                                                     const heavykv::StepRunnerOptions* options,
                                                     absl::StatusOr<int32_t>* out) {
  *out = heavykv::CudaDefaultKvPages(*model, *shape, *options);
}

HEAVYKV_CUDA_EXPORT void HeavykvCudaMakeRunnerV2(
    const heavykv::Model* model, heavykv::KvCache* cache,
    const heavykv::StepRunnerOptions* options,
    absl::StatusOr<std::unique_ptr<heavykv::StepRunner>>* out) {
  *out = heavykv::MakeCudaModelRunner(*model, cache, *options);
}
