// Internal to the int8 path of MatmulQuant (quant_dot.h): the tile that the int8 dot kernels
// take and their entry points, one per ISA. Kept apart from quant_dot.h, and free of any include
// with inline functions of external linkage, because quant_dot_simd.h includes it into files
// compiled for AVX2 and AVX-512.
#pragma once

#include <cstdint>

namespace heavykv::cpu::internal {

// A weight row's slice, unpacked (quant_dot.h, UnpackSlice): lv [len] levels, wsc and wmn
// [len / 4] lane scales and offsets.
struct UnpackedSlice {
  uint8_t* lv;
  float* wsc;
  float* wmn;
};
// out[r * ldo + c] = sum over the slice's len inputs of the dot of weight row r (w[r], r < nr <= 4)
// with activation row c (qs + c * qs_stride, scale and sum + c * f_stride; c < nc), each lane
// g adding wsc[g] * scale[g] * (lv . qs)_g - wmn[g] * sum[g] (quant_dot.h).
struct DotTile {
  const UnpackedSlice* w;  // [nr]
  int nr;
  const int8_t* qs;  // activation row 0 at the slice's first input
  const float* scale;
  const float* sum;
  int64_t qs_stride, f_stride;  // between activation rows: kp and kp / 4
  int nc;
  int64_t len;  // kp_len, a multiple of kDotPad
  bool signed_levels;
  float* out;
  int64_t ldo;
};
void DotTilePortable(const DotTile& t);
void DotTileAvx2(const DotTile& t);
void DotTileAvx512(const DotTile& t);
void DotTileAvx512Vnni(const DotTile& t);

// quant_dot.h's unpackers for `blocks` blocks at src of the type whose ggml id is type_id, in
// AVX2 (+ F16C); false for a type without one. Called through UnpackSlice.
bool UnpackSliceAvx2(int type_id, const uint8_t* src, int64_t blocks, const UnpackedSlice& out);

}  // namespace heavykv::cpu::internal
