// What the CPU attention writes into a slot's channel for each SlotChannel kind an eviction policy
// can ask for (kernels/slot_channel.h), against a double-precision reference: every ISA path this
// CPU runs, GQA, a chunk of several queries (causal), pages smaller than the vector blocks.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/paged_attention.h"
#include "tests/test_util.h"

namespace heavykv::cpu {
namespace {

struct Shape {
  int32_t head_dim, group, block_size, num_old, num_q;
};

// probs[i][s]: what slot s received from query i (summed over the group), for s < num_old + i + 1.
std::vector<std::vector<double>> ReferenceReceived(const PagedKvHead& kv, const Shape& c,
                                                   const std::vector<float>& q) {
  const int32_t hd = c.head_dim, G = c.group;
  std::vector<std::vector<double>> out(c.num_q);
  for (int32_t i = 0; i < c.num_q; ++i) {
    const int32_t n = c.num_old + i + 1;
    out[i].assign(n, 0.0);
    for (int32_t g = 0; g < G; ++g) {
      const float* qg = &q[(int64_t(i) * G + g) * hd];
      std::vector<double> p(n);
      double mx = -1e300, sum = 0;
      for (int32_t s = 0; s < n; ++s) {
        double dot = 0;
        for (int32_t d = 0; d < hd; ++d) dot += double(qg[d]) * kv.KAt(s, d);
        mx = std::max(mx, p[s] = dot / std::sqrt(double(hd)));
      }
      for (double& v : p) sum += (v = std::exp(v - mx));
      for (int32_t s = 0; s < n; ++s) out[i][s] += p[s] / sum;
    }
  }
  return out;
}

// The channel after the step, from `start` (every slot's value before it).
std::vector<double> ReferenceChannel(const ChannelSpec& ch, const Shape& c,
                                     const std::vector<std::vector<double>>& received,
                                     double start) {
  const int32_t slots = c.num_old + c.num_q;
  std::vector<double> v(slots, start);
  for (int32_t i = 0; i < c.num_q; ++i) {
    const int32_t n = c.num_old + i + 1;
    const double mean = double(c.group) / n;
    for (int32_t s = 0; s < n; ++s) {
      const double r = received[i][s];
      switch (ch.kind) {
        case SlotChannel::kAccumulated: v[s] += r; break;
        case SlotChannel::kLast: v[s] = r; break;
        case SlotChannel::kAboveMeanCount: v[s] = v[s] * ch.decay + (r > mean ? 1.0 : 0.0); break;
        case SlotChannel::kObservationWindow:
          if (i >= c.num_q - ch.window) v[s] += r;
          break;
        default: break;
      }
    }
  }
  return v;
}

class SlotChannelTest : public ::testing::TestWithParam<Shape> {};

TEST_P(SlotChannelTest, EachKindMatchesTheReference) {
  const Shape c = GetParam();
  const int32_t hd = c.head_dim, G = c.group, bs = c.block_size;
  const int32_t slots = c.num_old + c.num_q;
  const int32_t num_pages = (slots + bs - 1) / bs;
  std::mt19937 rng(hd * 7 + G * 3 + bs + slots);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<int32_t> pages(num_pages);
  for (int32_t p = 0; p < num_pages; ++p) pages[p] = num_pages - 1 - p;  // reversed page ids
  const int64_t page_stride = 2 * int64_t(bs) * hd;
  std::vector<float> pool(num_pages * page_stride);
  for (float& v : pool) v = 2.0f * normal(rng);
  std::vector<int32_t> pos(num_pages * bs, 0);
  std::vector<float> q(c.num_q * G * hd), out(c.num_q * G * hd);
  for (float& v : q) v = normal(rng);
  PagedKvHead kv;
  kv.pages = pages.data();
  kv.num_slots = slots;
  kv.block_size = bs;
  kv.head_dim = hd;
  kv.k = pool.data();
  kv.v = pool.data() + int64_t(bs) * hd;
  kv.page_stride = page_stride;
  kv.pos = pos.data();
  kv.meta_page_stride = bs;
  const std::vector<std::vector<double>> received = ReferenceReceived(kv, c, q);

  const ChannelSpec kinds[] = {{SlotChannel::kAccumulated},
                               {SlotChannel::kLast},
                               {SlotChannel::kAboveMeanCount, 0.75f},
                               {SlotChannel::kObservationWindow, 1.0f, 2},
                               {SlotChannel::kObservationWindow, 1.0f, 100}};
  for (const ChannelSpec& ch : kinds) {
    SCOPED_TRACE(::testing::Message() << "kind " << int(ch.kind) << " window " << ch.window);
    const std::vector<double> want = ReferenceChannel(ch, c, received, 0.5);
    for (Isa isa : heavykv::testing::IsasToTest()) {
      SCOPED_TRACE(IsaName(isa));
      std::vector<float> score(num_pages * bs, 0.5f);
      kv.score = score.data();
      AttentionArgs a;
      a.kv = kv;
      a.num_old = c.num_old;
      a.num_q = c.num_q;
      a.group = G;
      a.q = q.data();
      a.q_stride = int64_t(G) * hd;
      a.out = out.data();
      a.out_stride = int64_t(G) * hd;
      a.channel = ch;
      std::vector<float> scratch(AttentionScratchFloats(slots, G, c.num_q));
      PagedAttentionWith(isa, a, scratch.data());
      for (int32_t s = 0; s < slots; ++s) {
        EXPECT_NEAR(kv.Score(s), want[s], 1e-4) << "slot " << s;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, SlotChannelTest,
                         ::testing::Values(Shape{16, 2, 4, 5, 4},    // AVX-512 path
                                           Shape{8, 3, 16, 20, 1},   // AVX2 path, decode
                                           Shape{6, 1, 3, 7, 5},     // portable path
                                           Shape{64, 4, 16, 40, 6}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           const Shape& s = info.param;
                           return "hd" + std::to_string(s.head_dim) + "_g" +
                                  std::to_string(s.group) + "_bs" +
                                  std::to_string(s.block_size) + "_old" +
                                  std::to_string(s.num_old) + "_q" + std::to_string(s.num_q);
                         });

TEST(SlotChannelTest, NoneLeavesTheChannelAlone) {
  const int32_t hd = 16, bs = 4;
  std::vector<int32_t> pages = {0, 1};
  std::vector<float> pool(2 * 2 * bs * hd, 0.25f), q(hd, 1.0f), out(hd);
  std::vector<int32_t> pos(2 * bs, 0);
  std::vector<float> score(2 * bs, 7.0f);
  AttentionArgs a;
  a.kv.pages = pages.data();
  a.kv.num_slots = 6;
  a.kv.block_size = bs;
  a.kv.head_dim = hd;
  a.kv.k = pool.data();
  a.kv.v = pool.data() + bs * hd;
  a.kv.page_stride = 2 * bs * hd;
  a.kv.pos = pos.data();
  a.kv.score = score.data();
  a.kv.meta_page_stride = bs;
  a.num_old = 5;
  a.q = q.data();
  a.q_stride = hd;
  a.out = out.data();
  a.out_stride = hd;
  std::vector<float> scratch(AttentionScratchFloats(6, 1, 1));
  for (Isa isa : heavykv::testing::IsasToTest()) {
    PagedAttentionWith(isa, a, scratch.data());
    for (float v : score) EXPECT_EQ(v, 7.0f) << IsaName(isa);
  }
}

}  // namespace
}  // namespace heavykv::cpu
