// DotTileAvx512 (quant_dot_kernel.h): the int8 dot kernel of quant_dot_simd.h for
// AVX-512BW (512-bit maddubs + madd), on AVX-512 CPUs without VNNI (Skylake-SP, Cascade Lake).
// This file is compiled with that ISA's -m flags (kernels/cpu/CMakeLists.txt) and must only be
// called where the CPU has it (quant_gemm.cc checks); it includes nothing with external linkage
// that another file could share.
#include "kernels/cpu/quant_dot_simd.h"

namespace heavykv::cpu::internal {

void DotTileAvx512(const DotTile& t) { DotTileSimd(t); }

void PermuteLevelsAvx512(uint8_t* p, int64_t len) { PermuteLevelsSimd(p, len); }

bool FusedRowsAvx512(int type_id, const FusedRows& f) { return FusedRowsSimdFor(type_id, f); }

bool DecodeSliceAvx512(int type_id, const uint8_t* src, int64_t nsb, const UnpackedSlice& out) {
  return DecodeSliceSimdFor(type_id, src, nsb, out);
}

}  // namespace heavykv::cpu::internal
