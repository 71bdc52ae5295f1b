#include "kernels/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>

namespace heavykv::cpu {
namespace {

// Compiled for AVX-512, AVX2 and baseline x86-64, chosen at load time by CPU features (not by
// CPU model, as "arch=" clones would), so one binary is portable yet fast. The inner loops are
// written for the auto-vectoriser; `omp simd` lets it reorder the float reductions.
#define HEAVYKV_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))

HEAVYKV_MULTIVERSION
void AttendOneQuery(const AttentionArgs& a, int32_t qi, float* probs) {
  const PagedKvHead& kv = a.kv;
  const int32_t hd = kv.head_dim, bs = kv.block_size, G = a.group;
  const int32_t n = a.num_old + qi + 1;  // visible slots
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* q = a.q + qi * a.q_stride;

  // logits: probs[g * n + s] = q_g . k_s / sqrt(hd), walking the block table page by page so
  // that each page's K rows are read once for the whole group.
  for (int32_t s0 = 0; s0 < n; s0 += bs) {
    const float* kpage = kv.k + kv.pages[s0 / bs] * kv.page_stride;
    const int32_t rows = std::min(bs, n - s0);
    for (int32_t r = 0; r < rows; ++r) {
      const float* k = kpage + int64_t(r) * hd;
      for (int32_t g = 0; g < G; ++g) {
        const float* qg = q + int64_t(g) * hd;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int32_t d = 0; d < hd; ++d) dot += qg[d] * k[d];
        probs[int64_t(g) * n + s0 + r] = dot * scale;
      }
    }
  }
  for (int32_t g = 0; g < G; ++g) {
    float* p = probs + int64_t(g) * n;
    float mx = p[0];
    for (int32_t s = 1; s < n; ++s) mx = std::max(mx, p[s]);
    float sum = 0.0f;
    for (int32_t s = 0; s < n; ++s) {
      p[s] = expf(p[s] - mx);
      sum += p[s];
    }
    const float inv = 1.0f / sum;
    for (int32_t s = 0; s < n; ++s) p[s] *= inv;
  }
  // out_g = sum_s p_g[s] * v_s, again page by page; the same pass adds each slot's probability,
  // summed over the group, to its H2O score.
  float* out = a.out + qi * a.out_stride;
  std::fill(out, out + int64_t(G) * hd, 0.0f);
  for (int32_t s0 = 0; s0 < n; s0 += bs) {
    const int32_t page = kv.pages[s0 / bs];
    const float* vpage = kv.v + page * kv.page_stride;
    float* score = a.accumulate_scores ? kv.score + page * kv.meta_page_stride : nullptr;
    const int32_t rows = std::min(bs, n - s0);
    for (int32_t r = 0; r < rows; ++r) {
      const float* v = vpage + int64_t(r) * hd;
      float received = 0.0f;
      for (int32_t g = 0; g < G; ++g) {
        const float pg = probs[int64_t(g) * n + s0 + r];
        received += pg;
        float* og = out + int64_t(g) * hd;
        for (int32_t d = 0; d < hd; ++d) og[d] += pg * v[d];
      }
      if (score != nullptr) score[r] += received;
    }
  }
}

}  // namespace

void PagedAttention(const AttentionArgs& args, float* scratch) {
  for (int32_t qi = 0; qi < args.num_q; ++qi) AttendOneQuery(args, qi, scratch);
}

}  // namespace heavykv::cpu
