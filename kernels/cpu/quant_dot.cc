// The int8 path's portable pieces (quant_dot.h): activation quantization, the weight unpackers (one
// per block format, written as plain loops over whole blocks for the compiler to vectorise), the
// portable dot kernel, and the CPUID check for AVX512-VNNI.
#include "kernels/cpu/quant_dot.h"

#include <cpuid.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu/quant_kquants.h"

namespace heavykv::cpu::internal {
namespace {

inline float HalfAt(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return Fp16ToFloat(h);
}

// The scale and offset of inputs [4 * g0, 4 * (g0 + count)) (g0 and count multiples of 4): groups
// g0 / 4 .. of 16 in wsc and wmn.
inline void FillLanes(float* wsc, float* wmn, int64_t g0, int count, float sc, float mn) {
  for (int h = 0; h < count / 4; ++h) {
    wsc[g0 / 4 + h] = sc;
    wmn[g0 / 4 + h] = mn;
  }
}

// 32-element blocks: d and levels u with w = d * (u - offset).
void UnpackQ8_0(const uint8_t* src, int64_t nb, const UnpackedSlice& o) {
  for (int64_t b = 0; b < nb; ++b, src += 34) {
    const float d = HalfAt(src);
    for (int j = 0; j < 32; ++j) o.lv[32 * b + j] = uint8_t(src[2 + j] ^ 0x80);
    FillLanes(o.wsc, o.wmn, 8 * b, 8, d, 128.0f * d);
  }
}

void UnpackQ4_0(const uint8_t* src, int64_t nb, const UnpackedSlice& o) {
  for (int64_t b = 0; b < nb; ++b, src += 18) {
    const float d = HalfAt(src);
    uint8_t* lv = o.lv + 32 * b;
    for (int j = 0; j < 16; ++j) {
      lv[j] = src[2 + j] & 0xF;
      lv[16 + j] = src[2 + j] >> 4;
    }
    FillLanes(o.wsc, o.wmn, 8 * b, 8, d, 8.0f * d);
  }
}

void UnpackQ5_0(const uint8_t* src, int64_t nb, const UnpackedSlice& o) {
  for (int64_t b = 0; b < nb; ++b, src += 22) {
    const float d = HalfAt(src);
    uint32_t qh;
    std::memcpy(&qh, src + 2, sizeof(qh));
    uint8_t* lv = o.lv + 32 * b;
    for (int j = 0; j < 16; ++j) {
      lv[j] = uint8_t((src[6 + j] & 0xF) | (((qh >> j) & 1) << 4));
      lv[16 + j] = uint8_t((src[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
    }
    FillLanes(o.wsc, o.wmn, 8 * b, 8, d, 16.0f * d);
  }
}

// Super-blocks of 256 (quant_kquants.cc has the bit placement).
void UnpackQ4K(const uint8_t* src, int64_t nsb, const UnpackedSlice& o) {
  for (int64_t s = 0; s < nsb; ++s, src += 144) {
    const float d = HalfAt(src), dmin = HalfAt(src + 2);
    const uint8_t* q = src + 16;
    uint8_t* lv = o.lv + 256 * s;
    for (int j = 0; j < 8; j += 2, q += 32, lv += 64) {
      for (int l = 0; l < 32; ++l) {
        lv[l] = q[l] & 0xF;
        lv[32 + l] = q[l] >> 4;
      }
      for (int h = 0; h < 2; ++h) {
        int sc, mn;
        KScaleMin(src + 4, j + h, &sc, &mn);
        FillLanes(o.wsc, o.wmn, 64 * s + 8 * (j + h), 8, d * sc, dmin * mn);
      }
    }
  }
}

void UnpackQ5K(const uint8_t* src, int64_t nsb, const UnpackedSlice& o) {
  for (int64_t s = 0; s < nsb; ++s, src += 176) {
    const float d = HalfAt(src), dmin = HalfAt(src + 2);
    const uint8_t* qh = src + 16;
    const uint8_t* q = src + 48;
    uint8_t* lv = o.lv + 256 * s;
    for (int j = 0; j < 8; j += 2, q += 32, lv += 64) {
      for (int l = 0; l < 32; ++l) {
        lv[l] = uint8_t((q[l] & 0xF) | (((qh[l] >> j) & 1) << 4));
        lv[32 + l] = uint8_t((q[l] >> 4) | (((qh[l] >> (j + 1)) & 1) << 4));
      }
      for (int h = 0; h < 2; ++h) {
        int sc, mn;
        KScaleMin(src + 4, j + h, &sc, &mn);
        FillLanes(o.wsc, o.wmn, 64 * s + 8 * (j + h), 8, d * sc, dmin * mn);
      }
    }
  }
}

void UnpackQ6K(const uint8_t* src, int64_t nsb, const UnpackedSlice& o) {
  for (int64_t s = 0; s < nsb; ++s, src += 210) {
    const float d = HalfAt(src + 208);
    const auto* sc = reinterpret_cast<const int8_t*>(src + 192);
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = src + 64 * half;
      const uint8_t* qh = src + 128 + 32 * half;
      uint8_t* lv = o.lv + 256 * s + 128 * half;
      for (int l = 0; l < 32; ++l) {
        lv[l] = uint8_t((ql[l] & 0xF) | ((qh[l] & 3) << 4));
        lv[32 + l] = uint8_t((ql[32 + l] & 0xF) | (((qh[l] >> 2) & 3) << 4));
        lv[64 + l] = uint8_t((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
        lv[96 + l] = uint8_t((ql[32 + l] >> 4) | (((qh[l] >> 6) & 3) << 4));
      }
    }
    // Sub-block j of 16 inputs: w = d * sc[j] * (u - 32).
    for (int j = 0; j < 16; ++j) {
      const float dj = d * sc[j];
      FillLanes(o.wsc, o.wmn, 64 * s + 4 * j, 4, dj, 32.0f * dj);
    }
  }
}

}  // namespace

bool HasInt8Dot(QuantType type) {
  switch (type) {
    case QuantType::kQ8_0:
    case QuantType::kQ4_0:
    case QuantType::kQ5_0:
    case QuantType::kQ4_K:
    case QuantType::kQ5_K:
    case QuantType::kQ6_K: return true;
    default: return false;
  }
}

bool HasAvx512Vnni() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 11)) != 0;
}

int64_t Int8ActBlock(QuantType type) { return QuantBlockElems(type) == 256 ? 256 : 32; }

bool HasAvxVnni() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 4)) != 0;
}

void QuantizeActRows(const float* x, int64_t i0, int64_t i1, const QuantActs& a) {
  const int64_t block = a.block, nb = a.k / block;
  for (int64_t i = i0; i < i1; ++i) {
    const float* xr = x + i * a.k;
    int8_t* q = a.qs + i * a.kp;
    float* scale = a.scale + i * (a.kp / 16);
    float* sum = a.sum + i * (a.kp / 16);
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = xr + block * b;
      float amax = 0.0f;
      for (int64_t j = 0; j < block; ++j) {
        const float v = std::fabs(xb[j]);
        amax = v > amax ? v : amax;
      }
      const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
      int8_t* qb = q + block * b;
      // |xb[j] * id| <= 127 (up to rounding, which NearestInt keeps at 127).
      for (int64_t j = 0; j < block; ++j) qb[j] = int8_t(NearestInt(xb[j] * id));
      for (int64_t h = 0; h < block / 16; ++h) {
        scale[block / 16 * b + h] = d;
        int s = 0;
        for (int j = 0; j < 16; ++j) s += qb[16 * h + j];
        sum[block / 16 * b + h] = d * float(s);
      }
    }
    for (int64_t j = a.k; j < a.kp; ++j) q[j] = 0;
    for (int64_t h = a.k / 16; h < a.kp / 16; ++h) scale[h] = sum[h] = 0.0f;
  }
}

void UnpackSlice(QuantType type, const uint8_t* row, int64_t k0, int64_t len,
                 const UnpackedSlice& out, bool avx2) {
  const int64_t block = QuantBlockElems(type);
  const uint8_t* src = row + k0 / block * QuantBlockBytes(type);
  const int64_t nb = len / block;
  if (avx2 && UnpackSliceAvx2(static_cast<int>(type), src, nb, out)) {
    // done
  } else {
    switch (type) {
      case QuantType::kQ8_0: UnpackQ8_0(src, nb, out); break;
      case QuantType::kQ4_0: UnpackQ4_0(src, nb, out); break;
      case QuantType::kQ5_0: UnpackQ5_0(src, nb, out); break;
      case QuantType::kQ4_K: UnpackQ4K(src, nb, out); break;
      case QuantType::kQ5_K: UnpackQ5K(src, nb, out); break;
      case QuantType::kQ6_K: UnpackQ6K(src, nb, out); break;
      default: std::abort();  // HasInt8Dot(type) is the caller's check
    }
  }
  const int64_t padded = (len + kDotPad - 1) / kDotPad * kDotPad;
  std::memset(out.lv + len, 0, padded - len);
  for (int64_t h = len / 16; h < padded / 16; ++h) out.wsc[h] = out.wmn[h] = 0.0f;
}

void DotTilePortable(const DotTile& t) {
  for (int r = 0; r < t.nr; ++r) {
    const UnpackedSlice& w = t.w[r];
    for (int c = 0; c < t.nc; ++c) {
      const int8_t* q = t.qs + c * t.qs_stride;
      const float* scale = t.scale + c * t.f_stride;
      const float* sum = t.sum + c * t.f_stride;
      float acc = 0.0f;
      for (int64_t h = 0; h < t.len / 16; ++h) {
        int32_t dot = 0;
        for (int j = 0; j < 16; ++j) dot += int32_t(w.lv[16 * h + j]) * q[16 * h + j];
        acc += w.wsc[h] * scale[h] * float(dot) - w.wmn[h] * sum[h];
      }
      t.out[r * t.ldo + c] = acc;
    }
  }
}

}  // namespace heavykv::cpu::internal
