// DotTileAvx512Vnni (quant_dot_kernel.h): the int8 dot kernel of quant_dot_simd.h for
// AVX512-VNNI (512-bit dpbusd).
// This file is compiled with that ISA's -m flags (kernels/cpu/CMakeLists.txt) and must only be
// called where the CPU has it (quant_gemm.cc checks); it includes nothing with external linkage
// that another file could share.
#include "kernels/cpu/quant_dot_simd.h"

namespace heavykv::cpu::internal {

void DotTileAvx512Vnni(const DotTile& t) { DotTileSimd(t); }

void FusedRowsQ4KAvx512Vnni(const FusedRows& f) { FusedRowsQ4KSimd(f); }

}  // namespace heavykv::cpu::internal
