// For AVX-512BW (512-bit maddubs + madd; AVX-512 CPUs without VNNI: Skylake-SP, Cascade Lake) the
// pieces of quant_dot_simd.h (quant_dot_kernel.h): DotTileAvx512, the int8 dot kernel;
// PermuteLevelsAvx512, its lane order; FusedRowsAvx512, the Q4_K / Q6_K / Q8_0 rows read straight
// from their blocks for small batches; and DecodeSliceAvx512, the same decoders writing a slice in
// lane order (no VNNI needed: the VNNI path uses it too). This file is compiled with
// -mavx512f -mavx512bw (and AVX2, FMA, F16C; kernels/cpu/CMakeLists.txt) and must only be called
// where the CPU has them (quant_gemm.cc checks); it includes nothing with external linkage that
// another file could share.
#include "kernels/cpu/quant_dot_simd.h"

namespace heavykv::cpu::internal {

void DotTileAvx512(const DotTile& t) { DotTileSimd(t); }

void PermuteLevelsAvx512(uint8_t* p, int64_t len) { PermuteLevelsSimd(p, len); }

bool FusedRowsAvx512(int type_id, const FusedRows& f) { return FusedRowsSimdFor(type_id, f); }

bool DecodeSliceAvx512(int type_id, const uint8_t* src, int64_t nsb, const UnpackedSlice& out) {
  return DecodeSliceSimdFor(type_id, src, nsb, out);
}

}  // namespace heavykv::cpu::internal
