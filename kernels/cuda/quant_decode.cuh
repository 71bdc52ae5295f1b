// Device-side decoding of the block formats of quant_blocks.cuh, read from the file's bytes
// unchanged (kernels/cpu/quant_types.h documents each layout; kernels/cpu/quant_kquants.cc the
// K-quant bit placement). Written here from those definitions. Included by quant_gemv.cu and
// quant_dequant.cu; host-callable too (__host__ __device__), so that tests/cuda/
// quant_decode_host_test.cc checks every chunk against cpu::DequantizeRow without a GPU.
//
// The unit of work is a chunk: 8 consecutive elements of one block (a block of 32 has 4 chunks, a
// K-quant super-block of 256 has 32). DecodeChunk<T>(block, c, v) writes elements 8c..8c+7 of
// the block into v[8], in fp32, with the reference dequantizers' arithmetic (d * q, or
// d * scale * q - dmin * min), so results equal cpu::DequantizeRow's bit for bit: the same fp32
// operations in the same order, and the K-quants' multiply-subtract written with __fmul_rn /
// __fsub_rn (MulSub) so that nvcc does not fuse it into an FMA (the portable CPU code is not
// fused).
//
// Q4_K and Q5_K quants are read 8 bytes at a time (their blocks are 16-byte aligned); Q4_0, Q8_0
// and Q6_K blocks are only 2-byte aligned and are read with 16-bit loads.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/quant_blocks.cuh"

// #pragma unroll in device code only: the host compiler (g++ -Wall -Werror) does not know it.
#if defined(__CUDA_ARCH__)
#define HEAVYKV_DECODE_UNROLL _Pragma("unroll")
#else
#define HEAVYKV_DECODE_UNROLL
#endif

namespace heavykv::cuda {

namespace quant_internal {

__host__ __device__ __forceinline__ float HalfAt(const uint8_t* p) {  // p 2-byte aligned
  return __half2float(__ushort_as_half(*reinterpret_cast<const uint16_t*>(p)));
}

// 8 bytes at a 2-byte aligned address, as two little-endian words.
__host__ __device__ __forceinline__ uint2 Load8Bytes2(const uint8_t* p) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
  return make_uint2(uint32_t(h[0]) | (uint32_t(h[1]) << 16),
                    uint32_t(h[2]) | (uint32_t(h[3]) << 16));
}
// 8 bytes at an 8-byte aligned address.
__host__ __device__ __forceinline__ uint2 Load8Bytes8(const uint8_t* p) {
  return *reinterpret_cast<const uint2*>(p);
}
__host__ __device__ __forceinline__ int ByteOf(uint2 v, int i) {
  return int(((i < 4 ? v.x : v.y) >> (8 * (i & 3))) & 0xFF);
}

// a * b - c rounded twice, never fused (as the portable CPU dequantizer computes it).
__host__ __device__ __forceinline__ float MulSub(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(__fmul_rn(a, b), c);
#else
  const volatile float p = a * b;  // volatile: no contraction on hosts that have FMA
  return p - c;
#endif
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block's 12 scale bytes (as
// cpu::internal::KScaleMin).
__host__ __device__ __forceinline__ void KScaleMin(const uint8_t* s, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = s[j] & 63;
    *min = s[j + 4] & 63;
  } else {
    *scale = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Sub-block j's scale d * sc[j] and offset dmin * m[j] of a Q4_K / Q5_K block at b.
__host__ __device__ __forceinline__ void KSubBlockScale(const uint8_t* b, int j, float* d,
                                                        float* dm) {
  int sc, m;
  KScaleMin(b + 4, j, &sc, &m);
  *d = HalfAt(b) * float(sc);
  *dm = HalfAt(b + 2) * float(m);
}

}  // namespace quant_internal

template <QuantBlockType T>
__host__ __device__ __forceinline__ void DecodeChunk(const uint8_t* __restrict__ b, int c,
                                                     float v[8]);

// Q4_0: d; qs[16]: element e < 16 is the low nibble of qs[e], e >= 16 the high nibble of
// qs[e - 16]; x = d * (q - 8). Chunk c: qs[8 (c & 1) ..], nibble c >> 1.
template <>
__host__ __device__ __forceinline__ void DecodeChunk<QuantBlockType::kQ4_0>(
    const uint8_t* __restrict__ b, int c, float v[8]) {
  using namespace quant_internal;
  const float d = HalfAt(b);
  const uint2 q = Load8Bytes2(b + 2 + 8 * (c & 1));
  const int shift = 4 * (c >> 1);
  HEAVYKV_DECODE_UNROLL
  for (int i = 0; i < 8; ++i) v[i] = float(((ByteOf(q, i) >> shift) & 0xF) - 8) * d;
}

// Q8_0: d; int8 q[32]; x = q * d.
template <>
__host__ __device__ __forceinline__ void DecodeChunk<QuantBlockType::kQ8_0>(
    const uint8_t* __restrict__ b, int c, float v[8]) {
  using namespace quant_internal;
  const float d = HalfAt(b);
  const uint2 q = Load8Bytes2(b + 2 + 8 * c);
  HEAVYKV_DECODE_UNROLL
  for (int i = 0; i < 8; ++i) v[i] = float(int8_t(ByteOf(q, i))) * d;
}

// Q4_K: d, dmin, scales[12], qs[128]. Sub-block j = c / 4 (32 elements), offset l0 = 8 (c % 4);
// sub-blocks 2p and 2p + 1 share qs[32p .. 32p + 31] (low, high nibbles).
// x = d * sc[j] * q - dmin * m[j].
template <>
__host__ __device__ __forceinline__ void DecodeChunk<QuantBlockType::kQ4_K>(
    const uint8_t* __restrict__ b, int c, float v[8]) {
  using namespace quant_internal;
  const int j = c >> 2, l0 = 8 * (c & 3);
  float d, dm;
  KSubBlockScale(b, j, &d, &dm);
  const uint2 q = Load8Bytes8(b + 16 + 32 * (j >> 1) + l0);
  const int shift = 4 * (j & 1);
  HEAVYKV_DECODE_UNROLL
  for (int i = 0; i < 8; ++i) v[i] = MulSub(d, float((ByteOf(q, i) >> shift) & 0xF), dm);
}

// Q5_K: as Q4_K with qh[32] (bytes 16..47; bit j of qh[l] is the 5th bit of sub-block j's element
// l) before qs[128] (bytes 48..175).
template <>
__host__ __device__ __forceinline__ void DecodeChunk<QuantBlockType::kQ5_K>(
    const uint8_t* __restrict__ b, int c, float v[8]) {
  using namespace quant_internal;
  const int j = c >> 2, l0 = 8 * (c & 3);
  float d, dm;
  KSubBlockScale(b, j, &d, &dm);
  const uint2 q = Load8Bytes8(b + 48 + 32 * (j >> 1) + l0);
  const uint2 h = Load8Bytes8(b + 16 + l0);
  const int shift = 4 * (j & 1);
  HEAVYKV_DECODE_UNROLL
  for (int i = 0; i < 8; ++i) {
    const int qi = ((ByteOf(q, i) >> shift) & 0xF) | (((ByteOf(h, i) >> j) & 1) << 4);
    v[i] = MulSub(d, float(qi), dm);
  }
}

// Q6_K: ql[128], qh[64], int8 scales[16], d (bytes 208..209). Half h = c / 16 (128 elements:
// ql += 64h, qh += 32h, scales += 8h), quarter qd = (c / 4) % 4 (32 elements), offset
// l0 = 8 (c % 4): low 4 bits from ql[32 (qd & 1) + l], nibble qd >> 1; high 2 bits from qh[l] >>
// 2 qd; scale scales[l / 16 + 2 qd]. x = d * scale * (q - 32).
template <>
__host__ __device__ __forceinline__ void DecodeChunk<QuantBlockType::kQ6_K>(
    const uint8_t* __restrict__ b, int c, float v[8]) {
  using namespace quant_internal;
  const int h = c >> 4, qd = (c >> 2) & 3, l0 = 8 * (c & 3);
  const float d = HalfAt(b + 208);
  const float ds = d * float(int8_t(b[192 + 8 * h + (l0 >> 4) + 2 * qd]));
  const uint2 ql = Load8Bytes2(b + 64 * h + 32 * (qd & 1) + l0);
  const uint2 qh = Load8Bytes2(b + 128 + 32 * h + l0);
  const int lshift = 4 * (qd >> 1), hshift = 2 * qd;
  HEAVYKV_DECODE_UNROLL
  for (int i = 0; i < 8; ++i) {
    const int qi = ((ByteOf(ql, i) >> lshift) & 0xF) | (((ByteOf(qh, i) >> hshift) & 3) << 4);
    v[i] = ds * float(qi - 32);
  }
}

}  // namespace heavykv::cuda
