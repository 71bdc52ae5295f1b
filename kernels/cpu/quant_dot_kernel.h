// Internal to the int8 path of MatmulQuant (quant_dot.h): the tile that the int8 dot kernels
// take and their entry points, one per ISA. Kept apart from quant_dot.h, and free of any include
// with inline functions of external linkage, because quant_dot_simd.h includes it into files
// compiled for AVX2 and AVX-512.
#pragma once

#include <cstdint>

namespace heavykv::cpu::internal {

// Inputs per unit the kernels step through: a K-quant super-block, and the span of one vector of
// 16 offset terms (one per 16 inputs). Activation rows and slices are padded to it with zeros.
inline constexpr int64_t kDotPad = 256;

// A weight row's slice, unpacked (quant_dot.h, UnpackSlice): lv [len] levels, wsc [len / 4] lane
// scales, wmn [len / 16] offsets per 16 inputs.
struct UnpackedSlice {
  uint8_t* lv;
  float* wsc;
  float* wmn;
};
// out[r * ldo + c] = sum over the slice's len inputs of the dot of weight row r (w[r], r < nr <= 4)
// with activation row c (qs + c * qs_stride, scale + c * scale_stride, sum + c * sum_stride;
// c < nc): each lane g (4 inputs) adds wsc[g] * scale[g] * (lv . qs)_g and each 16 inputs h
// subtract wmn[h] * sum[h] (quant_dot.h). act_block256: scale[] is constant over each 256 inputs
// (the K-quants' activations), which the kernels apply once per 256 instead of once per lane.
struct DotTile {
  const UnpackedSlice* w;  // [nr]
  int nr;
  const int8_t* qs;  // activation row 0 at the slice's first input
  const float* scale;
  const float* sum;
  int64_t qs_stride, scale_stride, sum_stride;  // between activation rows: kp, kp / 4, kp / 16
  int nc;
  int64_t len;  // a multiple of kDotPad
  bool signed_levels;
  bool act_block256;
  float* out;
  int64_t ldo;
};
void DotTilePortable(const DotTile& t);
void DotTileAvx2(const DotTile& t);
void DotTileAvxVnni(const DotTile& t);
void DotTileAvx512(const DotTile& t);
void DotTileAvx512Vnni(const DotTile& t);

// quant_dot.h's unpackers for `blocks` blocks at src of the type whose ggml id is type_id, in
// AVX2 (+ F16C); false for a type without one. Called through UnpackSlice.
bool UnpackSliceAvx2(int type_id, const uint8_t* src, int64_t blocks, const UnpackedSlice& out);

}  // namespace heavykv::cpu::internal
