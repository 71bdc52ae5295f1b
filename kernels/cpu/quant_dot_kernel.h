// Internal to the int8 path of MatmulQuant (quant_dot.h): the tile that the int8 dot kernels
// take and their entry points, one per ISA. Kept apart from quant_dot.h, and free of any include
// with inline functions of external linkage, because quant_dot_simd.h includes it into files
// compiled for AVX2 and AVX-512.
#pragma once

#include <cstdint>

namespace heavykv::cpu::internal {

// Inputs per unit the kernels step through (a K-quant super-block; two or one of the vector
// kernels' super-chunks). Activation rows and slices are padded to it with zeros.
inline constexpr int64_t kDotPad = 256;

// A weight row's slice, unpacked (quant_dot.h, UnpackSlice): lv [len] levels, wsc and wmn
// [len / 16] scale and offset per 16 inputs.
struct UnpackedSlice {
  uint8_t* lv;
  float* wsc;
  float* wmn;
};
// out[r * ldo + c] = sum over the slice's len inputs of the dot of weight row r (w[r], r < nr <= 4)
// with activation row c (qs + c * qs_stride, scale and sum + c * f_stride; c < nc): each group h
// of 16 inputs adds wsc[h] * scale[h] * (lv . qs)_h - wmn[h] * sum[h] (quant_dot.h). The levels
// and activations are in natural order for the portable kernel and permuted by the vector
// kernel's PermuteLevels for the others (the scales and sums are per group: never permuted).
struct DotTile {
  const UnpackedSlice* w;  // [nr]
  int nr;
  const int8_t* qs;  // activation row 0 at the slice's first input
  const float* scale;
  const float* sum;
  int64_t qs_stride, f_stride;  // between activation rows: kp and kp / 16
  int nc;
  int64_t len;  // a multiple of kDotPad
  bool signed_levels;
  float* out;
  int64_t ldo;
};
void DotTilePortable(const DotTile& t);
void DotTileAvx2(const DotTile& t);
void DotTileAvxVnni(const DotTile& t);
void DotTileAvx512(const DotTile& t);
void DotTileAvx512Vnni(const DotTile& t);

// Small batches of weight rows without an unpacked copy (512-bit kernels; Q4_0, Q8_0, Q4_K, Q5_K,
// Q6_K):
// out[r * ldo + c] = the dot of rows[r] (nsb whole runs of 256 inputs from the slice's first: one
// K-quant super-block, or 8 Q8_0 blocks; r < nr) with activation row c < nc (4 at a time, each
// group decoding the rows again), given in the 512-bit kernels' permuted order, as DotTile
// computes it. False, doing nothing, for other types.
struct FusedRows {
  const uint8_t* const* rows;
  int nr;
  int64_t nsb;
  const int8_t* qs;
  const float* scale;
  const float* sum;
  int64_t qs_stride, f_stride;
  int nc;
  float* out;
  int64_t ldo;
};
bool FusedRowsAvx512(int type_id, const FusedRows& f);
bool FusedRowsAvx512Vnni(int type_id, const FusedRows& f);
// The same for 256-bit kernels (AVX2 maddubs, AVX-VNNI dpbusd), one activation row only (nc ==
// 1; false for more), in their lane order; Q4_0, Q8_0, Q4_K and Q6_K.
bool FusedRowsAvx2(int type_id, const FusedRows& f);
bool FusedRowsAvxVnni(int type_id, const FusedRows& f);

// The same decoders writing an unpacked slice of nsb runs of 256 inputs at src (the row's blocks
// from the slice's first), in the 512-bit kernels' order (what UnpackSlice then PermuteLevelsAvx512
// give). False, doing nothing, for other types.
bool DecodeSliceAvx512(int type_id, const uint8_t* src, int64_t nsb, const UnpackedSlice& out);

// The order the 256-bit (AVX2, AVX-VNNI) and 512-bit (AVX-512, AVX512-VNNI) kernels read levels
// and activations in: in place over `len` bytes (a multiple of kDotPad), within each run of 128 /
// 256 inputs (8 / 16 groups of 16), 4-byte word 4l + k (inputs 16l + 4k .. + 3) moves to word
// k * lanes + l, so that lane l of the run's k-th vector holds group l.
void PermuteLevelsAvx2(uint8_t* p, int64_t len);
void PermuteLevelsAvx512(uint8_t* p, int64_t len);

// quant_dot.h's unpackers for `blocks` blocks at src of the type whose ggml id is type_id, in
// AVX2 (+ F16C); false for a type without one. Called through UnpackSlice.
bool UnpackSliceAvx2(int type_id, const uint8_t* src, int64_t blocks, const UnpackedSlice& out);

}  // namespace heavykv::cpu::internal
