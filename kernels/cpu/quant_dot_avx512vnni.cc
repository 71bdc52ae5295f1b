// For AVX512-VNNI (512-bit dpbusd) the pieces of quant_dot_simd.h (quant_dot_kernel.h):
// DotTileAvx512Vnni, the int8 dot kernel, and FusedRowsAvx512Vnni, the Q4_K / Q6_K / Q8_0 rows
// read straight from their blocks for small batches (the lane order and the slice decoder are
// quant_dot_avx512.cc's). This file is compiled with -mavx512f -mavx512bw -mavx512vnni (and AVX2,
// FMA, F16C; kernels/cpu/CMakeLists.txt) and must only be called where the CPU has them
// (quant_gemm.cc checks); it includes nothing with external linkage that another file could share.
#include "kernels/cpu/quant_dot_simd.h"

namespace heavykv::cpu::internal {

void DotTileAvx512Vnni(const DotTile& t) { DotTileSimd(t); }

bool FusedRowsAvx512Vnni(int type_id, const FusedRows& f) { return FusedRowsSimdFor(type_id, f); }

}  // namespace heavykv::cpu::internal
