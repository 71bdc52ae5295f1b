#include "server/flags/dtype_flags.h"

namespace heavykv::cli {

void DtypeFlags::Register(FlagSet& flags, bool with_weights) {
  if (with_weights) {
    flags.String("weight-dtype", &weight_name,
                 "auto, fp32 or bf16: the weight matrices in memory (auto: the checkpoint's "
                 "fp32); bf16 halves their memory and the bytes a step streams, the arithmetic "
                 "stays fp32");
    flags.String("gpu-weights", &gpu_weights_name,
                 "bf16 or quantized (--device cuda): bf16 uploads every matrix as bf16; "
                 "quantized keeps a GGUF file's q4_0/q8_0/q4_K/q5_K/q6_K blocks on the GPU "
                 "(UNVERIFIED: compiled, never run on a GPU yet; issue 32)");
  }
  flags.String("kv-dtype", &kv_name,
               "auto, fp32, bf16, int8 or int4: the cached K/V (auto: fp32 on cpu, bf16 on "
               "cuda); bf16 holds twice the tokens per MiB, int8 (cpu) ~1.9x bf16's, int4 "
               "(cpu) ~3.3x");
}

absl::Status DtypeFlags::Resolve(Device device) {
  absl::StatusOr<cpu::WeightType> w = ParseWeightDtype(weight_name);
  if (!w.ok()) return w.status();
  absl::StatusOr<KvDtype> k = ResolveKvDtype(device, kv_name);
  if (!k.ok()) return k.status();
  absl::StatusOr<GpuWeights> g = ParseGpuWeights(gpu_weights_name);
  if (!g.ok()) return g.status();
  if (absl::Status s = CheckGpuWeights(device, *g); !s.ok()) return s;
  gpu_weights = *g;
  weights = *w;
  kv = *k;
  return absl::OkStatus();
}

}  // namespace heavykv::cli
