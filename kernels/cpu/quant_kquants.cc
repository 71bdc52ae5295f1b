// The K-quants (Q4_K, Q5_K, Q6_K): super-blocks of 256 elements in sub-blocks of 32 (Q4_K,
// Q5_K: an unsigned 4- or 5-bit level, a 6-bit scale and a 6-bit min per sub-block, both
// multiplied by the block's fp16 d and dmin) or 16 (Q6_K: a signed 6-bit level and an int8 scale
// per sub-block, times the fp16 d).
//
// Bit placement (ggml's): the levels of each 64 elements (Q4_K, Q5_K) sit in 32 bytes, element l
// in the low nibble of byte l and element 32 + l in the high nibble; Q5_K's 5th bits are bits
// 2i and 2i + 1 of qh[l] for the i-th group of 64. Q6_K's 128-element halves each take 64 bytes
// of ql and 32 of qh: elements l, 32 + l, 64 + l, 96 + l (l < 32) have their low nibbles in
// ql[l] low, ql[32 + l] low, ql[l] high, ql[32 + l] high and their top 2 bits in bits 0-1, 2-3,
// 4-5, 6-7 of qh[l].
//
// The quantizers search each sub-block's scale (and min) as llama.cpp's reference quantizer
// does without an importance matrix: a weighted least-squares fit over a small grid of trial
// scales, then 6-bit (8-bit for Q6_K) codes for the sub-block scales, then the levels again
// against the coded scales. Same arithmetic in the same order, so the bytes agree with
// llama-quantize's.
#include "kernels/cpu/quant_kquants.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/quant_types.h"

namespace heavykv::cpu::internal {
namespace {

constexpr float kGroupMaxEps = 1e-15f;

inline uint16_t Load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, sizeof(v)); }

// Levels L[n] in 0..nmax and (scale, min) with x ~ scale * L - min, minimising the error
// weighted by `w`: start from the range (min(x, 0) .. max(x)), then try nstep + 1 scales
// (nmax + rmin + rdelta * is levels over the range), refitting scale and min by least squares on
// each trial's levels and keeping the best. Returns the scale; *neg_min = -min >= 0.
float FitScaleMin(int n, int nmax, const float* x, const float* w, uint8_t* L, float* neg_min,
                  float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0];
  float sum_w = w[0], sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    min = x[i] < min ? x[i] : min;
    max = x[i] > max ? x[i] : max;
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(L, L + n, 0);
    *neg_min = -min;
    return 0.0f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = NearestInt(iscale * (x[i] - min));
    L[i] = uint8_t(std::max(0, std::min(nmax, l)));
    const float diff = scale * L[i] + min - x[i];
    best_error += w[i] * (diff * diff);
  }
  uint8_t trial[32];
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(0, std::min(nmax, NearestInt(iscale * (x[i] - min))));
      trial[i] = uint8_t(l);
      sum_l += w[i] * l;
      sum_l2 += w[i] * l * l;
      sum_xl += w[i] * l * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float error = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * trial[i] + this_min - x[i];
        error += w[i] * (diff * diff);
      }
      if (error < best_error) {
        std::copy(trial, trial + n, L);
        best_error = error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *neg_min = -min;
  return scale;
}

// Q4_K and Q5_K share everything but the level count (15 or 31), the search grid and where the
// levels go. Writes d, dmin and the 12 scale bytes at `block` and the levels to L[256].
void QuantizeKScales(const float* x, int nmax, float rmin, int nstep, uint8_t* block, uint8_t* L) {
  float scales[8], mins[8], weights[32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    scales[j] = FitScaleMin(32, nmax, xs, weights, L + 32 * j, &mins[j], rmin, 0.1f, nstep);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t* s = block + 4;
  std::memset(s, 0, 12);
  for (int j = 0; j < 8; ++j) {
    const uint8_t ls = std::min<uint8_t>(63, uint8_t(NearestInt(inv_scale * scales[j])));
    const uint8_t lm = std::min<uint8_t>(63, uint8_t(NearestInt(inv_min * mins[j])));
    if (j < 4) {
      s[j] = ls;
      s[j + 4] = lm;
    } else {
      s[j + 4] = uint8_t((ls & 0xF) | ((lm & 0xF) << 4));
      s[j - 4] |= uint8_t((ls >> 4) << 6);
      s[j] |= uint8_t((lm >> 4) << 6);
    }
  }
  Store16(block, FloatToFp16(max_scale / 63.f));
  Store16(block + 2, FloatToFp16(max_min / 63.f));
  const float d = Fp16ToFloat(Load16(block)), dmin = Fp16ToFloat(Load16(block + 2));
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    KScaleMin(s, j, &sc, &m);
    const float dj = d * sc;
    if (dj == 0.0f) continue;
    const float mj = dmin * m;
    for (int i = 0; i < 32; ++i) {
      const int l = NearestInt((x[32 * j + i] + mj) / dj);
      L[32 * j + i] = uint8_t(std::max(0, std::min(nmax, l)));
    }
  }
}

// Q6_K's per-sub-block search: levels in -nmax..nmax-1 with weights x^2, trying 18 scales
// around nmax / max|x| and keeping the one with the best weighted least-squares fit. Returns
// the (signed) scale; L holds level + nmax.
float FitScaleSymmetric(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::fill(L, L + n, 0);
    return 0.0f;
  }
  float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::max(-nmax, std::min(nmax - 1, NearestInt(iscale * x[i])));
    L[i] = int8_t(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(-nmax, std::min(nmax - 1, NearestInt(iscale * x[i])));
      const float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        L[i] = int8_t(nmax + std::max(-nmax, std::min(nmax - 1, NearestInt(iscale * x[i]))));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

}  // namespace

void QuantizeQ4K(const float* x, uint8_t* dst, int64_t k) {
  uint8_t L[kQk];
  for (int64_t b = 0; b < k / kQk; ++b, x += kQk, dst += 144) {
    QuantizeKScales(x, 15, -1.0f, 20, dst, L);
    uint8_t* q = dst + 16;
    for (int j = 0; j < kQk; j += 64, q += 32) {
      for (int l = 0; l < 32; ++l) q[l] = uint8_t(L[j + l] | (L[j + l + 32] << 4));
    }
  }
}

void QuantizeQ5K(const float* x, uint8_t* dst, int64_t k) {
  uint8_t L[kQk];
  for (int64_t b = 0; b < k / kQk; ++b, x += kQk, dst += 176) {
    QuantizeKScales(x, 31, -0.5f, 15, dst, L);
    uint8_t* qh = dst + 16;
    uint8_t* ql = dst + 48;
    std::memset(qh, 0, 32);
    for (int j = 0, bit = 0; j < kQk; j += 64, bit += 2, ql += 32) {
      for (int l = 0; l < 32; ++l) {
        const int lo = L[j + l], hi = L[j + l + 32];
        qh[l] |= uint8_t(((lo >> 4) << bit) | ((hi >> 4) << (bit + 1)));
        ql[l] = uint8_t((lo & 0xF) | ((hi & 0xF) << 4));
      }
    }
  }
}

void QuantizeQ6K(const float* x, uint8_t* dst, int64_t k) {
  int8_t L[kQk];
  float scales[16];
  for (int64_t b = 0; b < k / kQk; ++b, x += kQk, dst += 210) {
    uint8_t* ql = dst;
    uint8_t* qh = dst + 128;
    auto* sc = reinterpret_cast<int8_t*>(dst + 192);
    float max_scale = 0, max_abs_scale = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = FitScaleSymmetric(16, 32, x + 16 * j, L + 16 * j);
      if (std::fabs(scales[j]) > max_abs_scale) {
        max_abs_scale = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(dst, 0, 210);
      continue;
    }
    const float iscale = -128.f / max_scale;
    Store16(dst + 208, FloatToFp16(1 / iscale));
    for (int j = 0; j < 16; ++j) sc[j] = int8_t(std::min(127, NearestInt(iscale * scales[j])));
    const float d = Fp16ToFloat(Load16(dst + 208));
    for (int j = 0; j < 16; ++j) {
      const float dj = d * sc[j];
      if (dj == 0.0f) continue;
      for (int i = 0; i < 16; ++i) {
        const int l = NearestInt(x[16 * j + i] / dj);
        L[16 * j + i] = int8_t(std::max(-32, std::min(31, l)) + 32);
      }
    }
    for (int j = 0; j < kQk; j += 128, ql += 64, qh += 32) {
      for (int l = 0; l < 32; ++l) {
        const int q1 = L[j + l], q2 = L[j + l + 32], q3 = L[j + l + 64], q4 = L[j + l + 96];
        ql[l] = uint8_t((q1 & 0xF) | ((q3 & 0xF) << 4));
        ql[l + 32] = uint8_t((q2 & 0xF) | ((q4 & 0xF) << 4));
        qh[l] = uint8_t((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
      }
    }
  }
}

void DequantizeQ4K(const uint8_t* src, float* y, int64_t k) {
  for (int64_t b = 0; b < k / kQk; ++b, src += 144) {
    const float d = Fp16ToFloat(Load16(src)), dmin = Fp16ToFloat(Load16(src + 2));
    const uint8_t* q = src + 16;
    for (int j = 0; j < 8; j += 2, q += 32) {
      int sc0, m0, sc1, m1;
      KScaleMin(src + 4, j, &sc0, &m0);
      KScaleMin(src + 4, j + 1, &sc1, &m1);
      const float d0 = d * sc0, mm0 = dmin * m0, d1 = d * sc1, mm1 = dmin * m1;
      for (int l = 0; l < 32; ++l) *y++ = d0 * (q[l] & 0xF) - mm0;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] >> 4) - mm1;
    }
  }
}

void DequantizeQ5K(const uint8_t* src, float* y, int64_t k) {
  for (int64_t b = 0; b < k / kQk; ++b, src += 176) {
    const float d = Fp16ToFloat(Load16(src)), dmin = Fp16ToFloat(Load16(src + 2));
    const uint8_t* qh = src + 16;
    const uint8_t* ql = src + 48;
    for (int j = 0; j < 8; j += 2, ql += 32) {
      int sc0, m0, sc1, m1;
      KScaleMin(src + 4, j, &sc0, &m0);
      KScaleMin(src + 4, j + 1, &sc1, &m1);
      const float d0 = d * sc0, mm0 = dmin * m0, d1 = d * sc1, mm1 = dmin * m1;
      for (int l = 0; l < 32; ++l) *y++ = d0 * ((ql[l] & 0xF) | (((qh[l] >> j) & 1) << 4)) - mm0;
      for (int l = 0; l < 32; ++l) {
        *y++ = d1 * ((ql[l] >> 4) | (((qh[l] >> (j + 1)) & 1) << 4)) - mm1;
      }
    }
  }
}

void DequantizeQ6K(const uint8_t* src, float* y, int64_t k) {
  for (int64_t b = 0; b < k / kQk; ++b, src += 210) {
    const float d = Fp16ToFloat(Load16(src + 208));
    const uint8_t* ql = src;
    const uint8_t* qh = src + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(src + 192);
    for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, y += 128) {
      for (int l = 0; l < 32; ++l) {
        const int s = l / 16;
        const int q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[s] * q1;
        y[l + 32] = d * sc[s + 2] * q2;
        y[l + 64] = d * sc[s + 4] * q3;
        y[l + 96] = d * sc[s + 6] * q4;
      }
    }
  }
}

}  // namespace heavykv::cpu::internal
