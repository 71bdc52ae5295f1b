// DotTileAvx512 (quant_dot_kernel.h): the int8 dot kernel of quant_dot_simd.h for
// AVX-512BW (512-bit maddubs + madd), on AVX-512 CPUs without VNNI (Skylake-SP, Cascade Lake).
// This file is compiled with that ISA's -m flags (kernels/cpu/CMakeLists.txt) and must only be
// called where the CPU has it (quant_gemm.cc checks); it includes nothing with external linkage
// that another file could share.
#include "kernels/cpu/quant_dot_simd.h"

namespace heavykv::cpu::internal {

void DotTileAvx512(const DotTile& t) { DotTileSimd(t); }

void PermuteLevelsAvx512(uint8_t* p, int64_t len) { PermuteLevelsSimd(p, len); }

void FusedRowsQ4KAvx512(const FusedRows& f) { FusedRowsQ4KSimd(f); }

}  // namespace heavykv::cpu::internal
