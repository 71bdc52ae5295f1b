// The x86 vector instruction sets the CPU kernels are written for, chosen once at run time from
// the CPU's feature bits (never from its model name, and never with -march=native: one binary
// must run fast on every x86-64 node). Kernels that have a hand-written path for an ISA take an
// Isa argument in their test entry points, so tests run every path the test machine supports.
#pragma once

#include <cpuid.h>

#include <cstdlib>
#include <string_view>
#include <vector>

namespace heavykv::cpu {

enum class Isa {
  kPortable,  // baseline x86-64 (SSE2), plain loops for the auto-vectoriser
  kAvx2,      // AVX2 + FMA + F16C, 16 ymm registers (Haswell and later, AMD Zen)
  kAvx512,    // AVX-512F, 32 zmm registers (Skylake-SP and later)
};

// F16C (fp16 <-> fp32 conversions; CPUID leaf 1, ECX bit 29), which the quantized kernels' AVX2
// path uses. Read from CPUID: clang 14's __builtin_cpu_supports does not know "f16c".
inline bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
}

// Whether this CPU can run `isa`'s code.
inline bool IsaSupported(Isa isa) {
  __builtin_cpu_init();  // idempotent; needed if this runs during static initialisation
  switch (isa) {
    case Isa::kPortable: return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HasF16c();
    case Isa::kAvx512: return __builtin_cpu_supports("avx512f");
  }
  return false;
}

// The ISA the kernels run (computed once): the widest this CPU supports, or narrower where the
// environment variable HEAVYKV_ISA says so (portable, avx2 or avx512; what the CPU lacks is never
// taken), to measure an AVX2-only machine's figures on an AVX-512 one. Kernels compiled as
// target_clones (parts of attention) still pick by the CPU alone.
inline Isa BestIsa() {
  static const Isa best = [] {
    Isa isa = IsaSupported(Isa::kAvx512) ? Isa::kAvx512
              : IsaSupported(Isa::kAvx2) ? Isa::kAvx2
                                         : Isa::kPortable;
    if (const char* cap = std::getenv("HEAVYKV_ISA"); cap != nullptr) {
      const std::string_view c(cap);
      if (c == "portable") isa = Isa::kPortable;
      if (c == "avx2" && isa == Isa::kAvx512) isa = Isa::kAvx2;
    }
    return isa;
  }();
  return best;
}

// Every ISA, narrowest first.
inline constexpr Isa kAllIsas[] = {Isa::kPortable, Isa::kAvx2, Isa::kAvx512};

// The ISAs of kAllIsas this CPU runs.
inline std::vector<Isa> SupportedIsas() {
  std::vector<Isa> isas;
  for (Isa isa : kAllIsas) {
    if (IsaSupported(isa)) isas.push_back(isa);
  }
  return isas;
}

inline const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kPortable: return "portable";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

}  // namespace heavykv::cpu
