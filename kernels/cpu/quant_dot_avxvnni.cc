// DotTileAvxVnni and FusedRowsAvxVnni (quant_dot_kernel.h): the int8 dot kernel and the batch-1
// fused decoders of quant_dot_simd.h for AVX-VNNI (256-bit dpbusd, VEX-encoded: Alder Lake and
// later client cores, Zen 5), on CPUs that have it without AVX-512 or where AVX2 is asked for.
// This file is compiled with -mavx2 -mfma -mf16c -mavxvnni (kernels/cpu/CMakeLists.txt) and must
// only be called where the CPU has them (quant_gemm.cc checks); it includes nothing with external
// linkage that another file could share.
#include "kernels/cpu/quant_dot_fused256.h"

namespace heavykv::cpu::internal {

void DotTileAvxVnni(const DotTile& t) { DotTileSimd(t); }

bool FusedRowsAvxVnni(int type_id, const FusedRows& f) { return FusedRowsSimdFor(type_id, f); }

}  // namespace heavykv::cpu::internal
