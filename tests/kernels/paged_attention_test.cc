// Paged attention against a direct double-precision softmax attention: every ISA path the CPU
// runs (AVX-512, AVX2, portable), GQA groups, several queries of a chunk (causal), block sizes
// smaller than the 8- and 16-slot vector blocks, scattered page ids, and the H2O score each slot receives; with fp32 and
// with bf16 K/V storage (the reference then reads the same bf16-rounded values).
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/quant_dot.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "tests/test_util.h"

namespace heavykv::cpu {
namespace {

struct Case {
  int32_t head_dim, group, block_size, num_old, num_q;
};

class PagedAttentionTest : public ::testing::TestWithParam<Case> {};

// A block table of `num_pages` distinct ids drawn in shuffled order from a pool of `pool_pages`.
std::vector<int32_t> ShuffledPageTable(int32_t num_pages, int32_t pool_pages, std::mt19937& rng) {
  std::vector<int32_t> pages(pool_pages);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  pages.resize(num_pages);
  return pages;
}

// A view of `slots` quantized rows on `pages` of `bs` rows, each page `stride` bytes from
// `base` and starting [K data][V data][K scales][V scales]; pos and score are the caller's.
PagedKvHead QuantHead(KvQuant quant, int32_t hd, int32_t bs, const int32_t* pages, int32_t slots,
                      uint8_t* base, int64_t stride) {
  PagedKvHead kv;
  kv.pages = pages;
  kv.num_slots = slots;
  kv.block_size = bs;
  kv.head_dim = hd;
  kv.quant = quant;
  kv.row_bytes = KvQuantDataBytes(quant, hd);
  kv.scale_bytes = KvQuantScaleBytes(quant, hd);
  kv.kq = base;
  kv.vq = base + int64_t(bs) * kv.row_bytes;
  kv.ksc = base + 2 * int64_t(bs) * kv.row_bytes;
  kv.vsc = kv.ksc + int64_t(bs) * kv.scale_bytes;
  kv.page_stride = stride;
  return kv;
}

// Whether `isa`'s path takes q.k of int8 rows as integer dot products (AVX512-VNNI): the query
// is then rounded to int8 (max|q| / 127 steps, in the basis the rows are stored in).
bool RoundsQueryToInt8(Isa isa, const PagedKvHead& kv) {
  return isa == Isa::kAvx512 && internal::HasAvx512Vnni() && kv.quant == KvQuant::kInt8 &&
         kv.head_dim % 64 == 0 && kv.head_dim <= 128;
}

// q as that path sees it: rotated where the rows are, rounded to int8 steps, rotated back.
std::vector<float> RoundedQuery(const PagedKvHead& kv, std::vector<float> q) {
  const int32_t hd = kv.head_dim;
  for (size_t r = 0; r < q.size() / hd; ++r) {
    float* row = &q[r * hd];
    if (kv.rotated()) HadamardRotate(row, hd);
    float amax = 0.0f;
    for (int32_t d = 0; d < hd; ++d) amax = std::max(amax, std::fabs(row[d]));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int32_t d = 0; d < hd; ++d) row[d] = std::nearbyint(row[d] * inv) * (amax / 127.0f);
    if (kv.rotated()) HadamardRotate(row, hd);
  }
  return q;
}

// Attends `kv` (its slots [0, num_old + num_q)) with the queries q ([num_q][group][head_dim]) on
// every path the CPU runs, and compares the output and the H2O score each slot receives with a
// direct softmax attention in double over the values the view holds (KAt/VAt), to `tol` (the
// query rounded as the path rounds it, RoundsQueryToInt8).
void ExpectEveryPathMatchesDirectAttention(PagedKvHead kv, const Case& c,
                                           const std::vector<float>& q_in, int64_t score_entries,
                                           double tol) {
  for (Isa isa : heavykv::testing::IsasToTest()) {
  SCOPED_TRACE(IsaName(isa));
  const std::vector<float>& q = q_in;
  const std::vector<float> q_ref = RoundsQueryToInt8(isa, kv) ? RoundedQuery(kv, q_in) : q_in;
  const int32_t hd = c.head_dim, G = c.group, slots = c.num_old + c.num_q;
  std::vector<double> ref_out(q.size()), ref_score(slots, 0.0);
  for (int32_t i = 0; i < c.num_q; ++i) {
    const int32_t n = c.num_old + i + 1;
    for (int32_t g = 0; g < G; ++g) {
      const float* qg = &q_ref[(int64_t(i) * G + g) * hd];
      std::vector<double> p(n);
      double mx = -1e300, sum = 0;
      for (int32_t s = 0; s < n; ++s) {
        double dot = 0;
        for (int32_t d = 0; d < hd; ++d) dot += double(qg[d]) * kv.KAt(s, d);
        p[s] = dot / std::sqrt(double(hd));
        mx = std::max(mx, p[s]);
      }
      for (double& v : p) sum += (v = std::exp(v - mx));
      for (int32_t s = 0; s < n; ++s) {
        p[s] /= sum;
        ref_score[s] += p[s];
        for (int32_t d = 0; d < hd; ++d) {
          ref_out[(int64_t(i) * G + g) * hd + d] += p[s] * kv.VAt(s, d);
        }
      }
    }
  }
  std::vector<float> out(q.size());
  {
    std::vector<float> score(score_entries, 0.5f);  // scores add to what a slot already has
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
    a.channel.kind = SlotChannel::kAccumulated;
    std::vector<float> scratch(AttentionScratchFloats(slots, G, c.num_q));
    PagedAttentionWith(isa, a, scratch.data());
    double err = 0, norm = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      err += (out[i] - ref_out[i]) * (out[i] - ref_out[i]);
      norm += ref_out[i] * ref_out[i];
    }
    EXPECT_LT(std::sqrt(err / norm), tol);
    for (int32_t s = 0; s < slots; ++s) {
      EXPECT_NEAR(kv.Score(s), 0.5 + ref_score[s], tol * (1 + ref_score[s])) << "slot " << s;
    }
  }
  }
}

TEST_P(PagedAttentionTest, MatchesDirectAttention) {
  for (bool bf16 : {false, true}) {
  SCOPED_TRACE(bf16 ? "bf16 K/V" : "fp32 K/V");
  const Case c = GetParam();
  const int32_t hd = c.head_dim, G = c.group, bs = c.block_size;
  const int32_t slots = c.num_old + c.num_q;
  const int32_t num_pages = (slots + bs - 1) / bs;
  std::mt19937 rng(hd * 131 + G * 17 + bs + slots);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // Pages in a shuffled order inside a larger pool, one (K, V) head per page.
  const int32_t pool_pages = 2 * num_pages + 3;
  const std::vector<int32_t> pages = ShuffledPageTable(num_pages, pool_pages, rng);
  const int64_t page_stride = 2 * int64_t(bs) * hd;
  std::vector<float> pool(pool_pages * page_stride);
  for (float& v : pool) v = 2.0f * normal(rng);  // sharp enough that softmax is not flat
  std::vector<int32_t> pos(pool_pages * bs, 0);
  std::vector<float> q(c.num_q * G * hd);
  for (float& v : q) v = normal(rng);

  PagedKvHead kv;
  kv.pages = pages.data();
  kv.num_slots = slots;
  kv.block_size = bs;
  kv.head_dim = hd;
  std::vector<uint16_t> pool16(pool.size());
  for (size_t i = 0; i < pool.size(); ++i) pool16[i] = FloatToBf16(pool[i]);
  if (bf16) {
    kv.k16 = pool16.data();
    kv.v16 = pool16.data() + int64_t(bs) * hd;
    // Rounding changed the values: a bf16 element is an fp32 with the low 16 bits zero.
    ASSERT_NE(kv.KAt(0, 0), pool[pages[0] * page_stride]);
  } else {
    kv.k = pool.data();
    kv.v = pool.data() + int64_t(bs) * hd;
  }
  kv.page_stride = page_stride;
  kv.pos = pos.data();
  kv.meta_page_stride = bs;

  ExpectEveryPathMatchesDirectAttention(kv, c, q, int64_t(pool_pages) * bs, 2e-6);
  }
}

// Quantized K/V (--kv-dtype int8 | int4, kernels/kv_quant.h) read in place by every path: the
// result is the attention over the dequantized values (the reference reads them through
// KAt/VAt), to float rounding. Pages laid out as KvCache lays them: [K data][V data][K scales]
// [V scales], in shuffled order.
TEST_P(PagedAttentionTest, QuantizedRowsMatchDirectAttentionOverTheirValues) {
  for (KvQuant quant : {KvQuant::kInt8, KvQuant::kInt4}) {
    SCOPED_TRACE(quant == KvQuant::kInt8 ? "int8 K/V" : "int4 K/V");
    const Case c = GetParam();
    const int32_t hd = c.head_dim, G = c.group, bs = c.block_size;
    const int32_t slots = c.num_old + c.num_q;
    const int32_t num_pages = (slots + bs - 1) / bs;
    std::mt19937 rng(hd * 71 + G * 13 + bs + slots);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int32_t pool_pages = 2 * num_pages + 3;
    const std::vector<int32_t> pages = ShuffledPageTable(num_pages, pool_pages, rng);
    const int32_t rb = KvQuantDataBytes(quant, hd), sb = KvQuantScaleBytes(quant, hd);
    const int64_t page_stride = 2 * int64_t(bs) * (rb + sb);
    std::vector<uint8_t> pool(pool_pages * page_stride, 0xEE);
    std::vector<int32_t> pos(pool_pages * bs, 0);
    std::vector<float> q(c.num_q * G * hd);
    for (float& v : q) v = normal(rng);
    PagedKvHead kv = QuantHead(quant, hd, bs, pages.data(), slots, pool.data(), page_stride);
    kv.pos = pos.data();
    kv.meta_page_stride = bs;
    std::vector<float> krow(hd), vrow(hd);
    for (int32_t s = 0; s < slots; ++s) {
      // Rows of different magnitudes, so that the scales differ from row to row.
      const float mag = 0.25f + 4.0f * float(s % 7) / 7.0f;
      for (int32_t d = 0; d < hd; ++d) {
        krow[d] = mag * normal(rng);
        vrow[d] = mag * normal(rng);
      }
      kv.StoreRows(s, krow.data(), vrow.data());
      // The error of a value: half a step of its scale, which is at most max|x| / 63.5 for int8,
      // and at most max|x| / 8 for int4 (the clamp of +8 steps to 7), x the stored row: H k where
      // the rows are rotated, whose error the rotation back spreads but keeps in L2 norm.
      std::vector<float> stored = krow;
      if (kv.rotated()) HadamardRotate(stored.data(), hd);
      float amax = 0.0f;
      for (int32_t d = 0; d < hd; ++d) amax = std::max(amax, std::fabs(stored[d]));
      const double bound = (quant == KvQuant::kInt8 ? amax / 127 : amax / 8) * 1.01;
      double err2 = 0;
      for (int32_t d = 0; d < hd; ++d) err2 += std::pow(double(kv.KAt(s, d)) - krow[d], 2);
      ASSERT_LE(std::sqrt(err2), bound * std::sqrt(double(hd)) + 1e-6) << "slot " << s;
    }
    ExpectEveryPathMatchesDirectAttention(kv, c, q, int64_t(pool_pages) * bs, 4e-6);
  }
}

// One (sequence, kv head)'s K/V over `slots` slots on pages of `bs` in shuffled order (each page
// its K rows, then its V rows), values 2 x normal (sharp enough that softmax is not flat), fp32
// and the same rounded to bf16; and `num_q` queries of `group` heads.
struct RandomHead {
  RandomHead(int32_t slots, int32_t bs, int32_t hd, int32_t group, int32_t num_q, uint32_t seed)
      : slots(slots), bs(bs), hd(hd), group(group), num_pages((slots + bs - 1) / bs),
        pages(num_pages), pos(int64_t(num_pages) * bs, 0),
        pool(int64_t(num_pages) * 2 * bs * hd), q(int64_t(num_q) * group * hd) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    for (float& v : pool) v = 2.0f * normal(rng);
    for (float& v : q) v = normal(rng);
    pool16.resize(pool.size());
    for (size_t i = 0; i < pool.size(); ++i) pool16[i] = FloatToBf16(pool[i]);
  }
  // The head's arguments: its view (fp32 or bf16), the group, q and the row strides; num_old,
  // num_q, out, score and channel are the caller's.
  AttentionArgs Args(bool bf16) {
    AttentionArgs a;
    a.kv.pages = pages.data();
    a.kv.num_slots = slots;
    a.kv.block_size = bs;
    a.kv.head_dim = hd;
    if (bf16) {
      a.kv.k16 = pool16.data();
      a.kv.v16 = pool16.data() + int64_t(bs) * hd;
    } else {
      a.kv.k = pool.data();
      a.kv.v = pool.data() + int64_t(bs) * hd;
    }
    a.kv.page_stride = 2 * int64_t(bs) * hd;
    a.kv.pos = pos.data();
    a.kv.meta_page_stride = bs;
    a.group = group;
    a.q = q.data();
    a.q_stride = int64_t(group) * hd;
    a.out_stride = int64_t(group) * hd;
    return a;
  }
  int32_t slots, bs, hd, group, num_pages;
  std::vector<int32_t> pages, pos;
  std::vector<float> pool, q;
  std::vector<uint16_t> pool16;
};

// A group of query heads sharing a kv head gives each head exactly (bit for bit) what that head
// gets alone, on every path: the AVX-512 path walks the V pages once for the whole group
// (groups up to 16) and must not change any head's arithmetic.
TEST(PagedAttentionGroupTest, EachHeadOfAGroupEqualsItAlone) {
  constexpr int32_t kHd = 128, kBs = 16, kOld = 300;
  for (int32_t G : {2, 4, 8, 20}) {
    for (int32_t num_q : {1, 3}) {
      SCOPED_TRACE(::testing::Message() << "group " << G << ", " << num_q << " queries");
      const int32_t slots = kOld + num_q;
      RandomHead head(slots, kBs, kHd, G, num_q, G * 7 + num_q);
      const std::vector<float>& q = head.q;
      std::vector<float> score(int64_t(head.num_pages) * kBs, 0.0f);
      AttentionArgs a = head.Args(/*bf16=*/false);
      a.kv.score = score.data();
      a.num_old = kOld;
      a.num_q = num_q;
      for (Isa isa : heavykv::testing::IsasToTest()) {
        SCOPED_TRACE(IsaName(isa));
        std::vector<float> together(q.size()), alone(q.size());
        std::vector<float> scratch(AttentionScratchFloats(slots, G, num_q));
        AttentionArgs all = a;
        all.group = G;
        all.q = q.data();
        all.out = together.data();
        PagedAttentionWith(isa, all, scratch.data());
        for (int32_t g = 0; g < G; ++g) {
          AttentionArgs one = a;
          one.group = 1;
          one.q = q.data() + int64_t(g) * kHd;
          one.out = alone.data() + int64_t(g) * kHd;
          PagedAttentionWith(isa, one, scratch.data());
        }
        ASSERT_EQ(together, alone);
      }
    }
  }
}

// The queries of a chunk attended together (the AVX-512 path walks the pages once per tile of
// queries) give each query, its output and what it adds to the H2O scores, exactly (bit for bit)
// what attending that query alone gives, on every path: the tile must not change any query's
// arithmetic. Groups 1 (16 queries a tile), 4 (4 a tile), 8 (2) and 20 (one query at a time);
// chunks over several tiles and a last tile that is not full; pages of 16, 4 and 64 slots (over
// kMaxWidenedRows: bf16 V rows read in place); fp32 and bf16 K/V (bf16 rows widened once for a
// tile or a group, which must not change a bit either).
TEST(PagedAttentionTileTest, EachQueryOfAChunkEqualsItAlone) {
  constexpr int32_t kHd = 64;
  for (bool bf16 : {false, true}) {
  for (int32_t bs : {16, 4, 64}) {
    for (int32_t G : {1, 4, 8, 20}) {
      for (int32_t num_old : {0, 37}) {
        constexpr int32_t kNumQ = 35;
        SCOPED_TRACE(::testing::Message() << "pages of " << bs << ", group " << G << ", "
                                          << num_old << " old slots" << (bf16 ? ", bf16" : ""));
        const int32_t slots = num_old + kNumQ;
        RandomHead head(slots, bs, kHd, G, kNumQ, G * 13 + num_old + bs);
        const std::vector<float>& q = head.q;
        const int32_t num_pages = head.num_pages;
        AttentionArgs a = head.Args(bf16);
        a.channel.kind = SlotChannel::kAccumulated;
        for (Isa isa : heavykv::testing::IsasToTest()) {
          SCOPED_TRACE(IsaName(isa));
          std::vector<float> together(q.size()), alone(q.size());
          std::vector<float> score_together(num_pages * bs, 0.25f), score_alone = score_together;
          std::vector<float> scratch(AttentionScratchFloats(slots, G, kNumQ));
          AttentionArgs all = a;
          all.num_old = num_old;
          all.num_q = kNumQ;
          all.q = q.data();
          all.out = together.data();
          all.kv.score = score_together.data();
          PagedAttentionWith(isa, all, scratch.data());
          for (int32_t i = 0; i < kNumQ; ++i) {
            AttentionArgs one = a;
            one.num_old = num_old + i;
            one.num_q = 1;
            one.q = q.data() + int64_t(i) * G * kHd;
            one.out = alone.data() + int64_t(i) * G * kHd;
            one.kv.score = score_alone.data();
            PagedAttentionWith(isa, one, scratch.data());
          }
          ASSERT_EQ(together, alone);
          ASSERT_EQ(score_together, score_alone);
        }
      }
    }
  }
  }
}

// A decode query's context split into parts, each attended alone (PartArgs) and combined
// (CombineAttentionParts), gives the output and the channel (each attention kind) of the unsplit
// call, to float rounding, on every path, fp32 and bf16 K/V, pages of 16 and of 4 slots, uneven
// parts and a one-page part.
TEST(PagedAttentionSplitTest, CombinedPartsEqualTheWholeContext) {
  constexpr int32_t kHd = 64, kSlots = 300;
  for (int32_t bs : {16, 4}) {
    for (int32_t G : {1, 4}) {
      for (bool bf16 : {false, true}) {
        RandomHead head(kSlots, bs, kHd, G, 1, bs * 5 + G + bf16);
        const std::vector<float>& q = head.q;
        const int32_t num_pages = head.num_pages;
        AttentionArgs a = head.Args(bf16);
        a.num_old = kSlots - 1;
        const std::vector<int32_t> bounds = {0, 16 * 5, 16 * 6, 16 * 15, kSlots};
        const int32_t parts = int32_t(bounds.size()) - 1;
        for (ChannelSpec ch : {ChannelSpec{SlotChannel::kNone},
                               ChannelSpec{SlotChannel::kAccumulated},
                               ChannelSpec{SlotChannel::kLast},
                               ChannelSpec{SlotChannel::kAboveMeanCount, 0.5f},
                               ChannelSpec{SlotChannel::kObservationWindow, 1.0f, 1}}) {
          for (Isa isa : heavykv::testing::IsasToTest()) {
            SCOPED_TRACE(::testing::Message() << "pages of " << bs << ", group " << G
                                              << (bf16 ? ", bf16" : ", fp32") << ", channel "
                                              << int(ch.kind) << ", " << IsaName(isa));
            std::vector<float> whole(q.size()), split(q.size());
            std::vector<float> score_whole(num_pages * bs, 0.25f), score_split = score_whole;
            std::vector<float> scratch(AttentionScratchFloats(kSlots, G, 1));
            AttentionArgs all = a;
            all.channel = ch;
            all.out = whole.data();
            all.kv.score = score_whole.data();
            PagedAttentionWith(isa, all, scratch.data());

            AttentionArgs cut = all;
            cut.out = split.data();
            cut.kv.score = score_split.data();
            std::vector<float> part_out(parts * G * kHd, -1.0f), part_stats(parts * G * 2);
            std::vector<std::vector<float>> part_scratch(parts);
            std::vector<const float*> part_probs(parts);
            for (int32_t j = 0; j < parts; ++j) {
              part_scratch[j].resize(AttentionScratchFloats(bounds[j + 1] - bounds[j], G, 1));
              PagedAttentionWith(isa, PartArgs(cut, bounds.data(), j, part_out.data(),
                                               part_stats.data()),
                                 part_scratch[j].data());
              part_probs[j] = part_scratch[j].data();
            }
            // The parts wrote no channel: the combine does.
            ASSERT_EQ(score_split, std::vector<float>(num_pages * bs, 0.25f));
            CombineAttentionParts(cut, bounds.data(), parts, part_out.data(), part_stats.data(),
                                  part_probs.data(), scratch.data());
            for (size_t i = 0; i < whole.size(); ++i) {
              ASSERT_NEAR(split[i], whole[i], 2e-6f * (1 + std::abs(whole[i]))) << i;
            }
            for (size_t i = 0; i < score_whole.size(); ++i) {
              ASSERT_NEAR(score_split[i], score_whole[i], 2e-6f * (1 + std::abs(score_whole[i])))
                  << "slot row " << i;
            }
          }
        }
      }
    }
  }
}

// MiKV: attention over a head's cache and its demoted store (quantized rows on pages of their own
// block size, scattered) equals one softmax over both, in double, with the values each view
// holds; every query of a chunk sees the whole store; each store's channel gets what its slots
// received (kAccumulated and kLast; kAboveMeanCount against the mean over both).
TEST(PagedAttentionDemotedTest, EqualsOneSoftmaxOverBothStores) {
  constexpr int32_t kHd = 32, kOld = 45, kQ = 19, kDemoted = 70;
  // Pages of 12 (a 16-slot block spans two) and of 48 (more than the 32 rows a V page is
  // widened at): what packed pages hold.
  for (int32_t kDbs : {12, 48}) {
  for (KvQuant quant : {KvQuant::kInt8, KvQuant::kInt4}) {
    for (int32_t G : {1, 2}) {
      RandomHead head(kOld + kQ, 8, kHd, G, kQ, 7 * G + int(quant));
      std::mt19937 rng(11 + G);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      // The demoted store: pages of kDbs slots, [K data][V data][K sc][V sc][pos][score] each.
      const int32_t d_pages = (kDemoted + kDbs - 1) / kDbs, pool_pages = d_pages + 4;
      const std::vector<int32_t> pages = ShuffledPageTable(d_pages, pool_pages, rng);
      const int32_t rb = KvQuantDataBytes(quant, kHd), sb = KvQuantScaleBytes(quant, kHd);
      const int64_t stride = int64_t(kDbs) * (2 * (rb + sb) + 8);
      std::vector<uint8_t> pool(pool_pages * stride + 64, 0xEE);
      uint8_t* base = pool.data() + (64 - reinterpret_cast<uintptr_t>(pool.data()) % 64) % 64;
      PagedKvHead d = QuantHead(quant, kHd, kDbs, pages.data(), kDemoted, base, stride);
      d.pos = reinterpret_cast<int32_t*>(d.vsc + kDbs * sb);
      d.score = reinterpret_cast<float*>(d.pos + kDbs);
      d.meta_page_stride = stride / 4;
      std::vector<float> krow(kHd), vrow(kHd);
      for (int32_t s = 0; s < kDemoted; ++s) {
        for (int32_t i = 0; i < kHd; ++i) {
          krow[i] = 2.0f * normal(rng);
          vrow[i] = normal(rng);
        }
        d.StoreRows(s, krow.data(), vrow.data());
      }
      for (ChannelSpec ch : {ChannelSpec{SlotChannel::kAccumulated},
                             ChannelSpec{SlotChannel::kLast},
                             ChannelSpec{SlotChannel::kAboveMeanCount, 0.5f}}) {
        for (Isa isa : heavykv::testing::IsasToTest()) {
          SCOPED_TRACE(::testing::Message()
                       << "pages of " << kDbs << ", "
                       << KvQuantName(quant) << ", group " << G
                       << ", channel " << int(ch.kind) << ", " << IsaName(isa));
          AttentionArgs a = head.Args(false);
          a.num_old = kOld;
          a.num_q = kQ;
          a.channel = ch;
          std::vector<float> out(head.q.size()), score(head.num_pages * 8, 0.5f);
          a.out = out.data();
          a.kv.score = score.data();
          for (int32_t s = 0; s < kDemoted; ++s) d.Score(s) = 0.5f;
          std::vector<float> scratch(AttentionScratchFloats(kOld + kQ, G, kQ));
          PagedAttentionWithDemoted(a, d, scratch.data(), isa);
          // The reference: query i sees demoted slots [0, kDemoted) and cache slots [0, kOld + i].
          std::vector<double> ref_main(kOld + kQ, 0.5), ref_dem(kDemoted, 0.5);
          for (int32_t i = 0; i < kQ; ++i) {
            const int32_t n = kOld + i + 1;
            std::vector<double> recv(n + kDemoted, 0.0);
            for (int32_t g = 0; g < G; ++g) {
              const float* q = &head.q[(int64_t(i) * G + g) * kHd];
              std::vector<double> l(n + kDemoted);
              double mx = -1e300, sum = 0;
              for (int32_t s = 0; s < n + kDemoted; ++s) {
                double dot = 0;
                for (int32_t c = 0; c < kHd; ++c) {
                  dot += double(q[c]) * (s < n ? a.kv.KAt(s, c) : d.KAt(s - n, c));
                }
                l[s] = dot / std::sqrt(double(kHd));
                mx = std::max(mx, l[s]);
              }
              for (double& v : l) sum += (v = std::exp(v - mx));
              for (int32_t c = 0; c < kHd; ++c) {
                double o = 0;
                for (int32_t s = 0; s < n + kDemoted; ++s) {
                  o += l[s] / sum * (s < n ? a.kv.VAt(s, c) : d.VAt(s - n, c));
                }
                ASSERT_NEAR(out[(int64_t(i) * G + g) * kHd + c], o, 2e-5 * (1 + std::abs(o)))
                    << "query " << i << " head " << g << " column " << c;
              }
              for (int32_t s = 0; s < n + kDemoted; ++s) recv[s] += l[s] / sum;
            }
            const double mean = double(G) / (n + kDemoted);
            for (int32_t s = 0; s < n + kDemoted; ++s) {
              double& r = s < n ? ref_main[s] : ref_dem[s - n];
              if (ch.kind == SlotChannel::kAccumulated) r += recv[s];
              if (ch.kind == SlotChannel::kLast) r = recv[s];
              if (ch.kind == SlotChannel::kAboveMeanCount) {
                r = r * ch.decay + (recv[s] > mean ? 1.0 : 0.0);
              }
            }
          }
          for (int32_t s = 0; s < kOld + kQ; ++s) {
            ASSERT_NEAR(a.kv.Score(s), ref_main[s], 2e-5 * (1 + ref_main[s])) << "slot " << s;
          }
          for (int32_t s = 0; s < kDemoted; ++s) {
            ASSERT_NEAR(d.Score(s), ref_dem[s], 2e-5 * (1 + ref_dem[s])) << "demoted " << s;
          }
        }
      }
    }
  }
  }
}

TEST(PagedAttentionTileTest, ScratchHoldsOneTile) {
  EXPECT_EQ(AttentionTileQueries(1), 16);
  EXPECT_EQ(AttentionTileQueries(4), 4);
  EXPECT_EQ(AttentionTileQueries(20), 1);
  EXPECT_EQ(AttentionScratchFloats(100, 4, 1), 400);
  EXPECT_EQ(AttentionScratchFloats(100, 4, 3), 1200);
  EXPECT_EQ(AttentionScratchFloats(100, 4, 512), 1600);  // a 512-query chunk: one tile of 4
  EXPECT_EQ(AttentionScratchFloats(100, 20, 512), 2000);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PagedAttentionTest,
    ::testing::Values(Case{64, 1, 16, 63, 1},    // a decode step, stories110M head
                    Case{64, 1, 16, 0, 1},     // the first token: one visible slot
                    Case{128, 4, 16, 200, 1},  // GQA 4 per kv head, head_dim 128
                    Case{8, 2, 16, 40, 1},     // the bundled model's head (not a multiple of 16)
                    Case{32, 2, 8, 37, 5},     // a chunk of 5, pages of 8 slots
                    Case{16, 3, 4, 21, 9},     // pages of 4: a 16-slot block spans four pages
                    Case{64, 2, 16, 0, 33},    // a prefill chunk from an empty cache
                    Case{48, 1, 16, 30, 1},    // stories15M's head: AVX2, not AVX-512
                    Case{256, 2, 16, 20, 2},   // over 64 columns: the AVX2 p.v in two blocks
                    Case{24, 1, 2, 9, 3},      // 3 vectors (odd/even accumulators), pages of 2
                    Case{64, 4, 28, 100, 3},   // packed int8 pages of a bf16 pool (28 slots)
                    Case{64, 1, 48, 120, 1}));  // packed int4 pages (48: V not widened)

}  // namespace
}  // namespace heavykv::cpu
