#include "engine/runner/shared_prefix.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>

namespace heavykv {

bool SharedPrefixAttention::Plan(std::span<const SequenceStep> steps, const KvCache& cache,
                                 int32_t num_layers, int32_t num_kv_heads, int32_t group_size,
                                 int32_t head_dim) {
  groups_.clear();
  n_kv_ = num_kv_heads;
  G_ = group_size;
  hd_ = head_dim;
  block_size_ = cache.shape().block_size;
  if (!cache.shape().table_per_layer || steps.size() < 2) return false;
  // Candidates by the first page of their layer-0 table.
  std::map<int32_t, std::vector<int32_t>> by_first;
  for (size_t i = 0; i < steps.size(); ++i) {
    const SequenceKv& kv = *steps[i].kv;
    if (steps[i].tokens.size() != 1 || kv.policy != nullptr || kv.quant != KvQuant::kNone ||
        !kv.demoted.empty() || kv.tables.empty() || kv.tables[0].pages.empty()) {
      continue;
    }
    by_first[kv.tables[0].pages[0]].push_back(int32_t(i));
  }
  group_of_.assign(steps.size(), -1);
  member_at_.assign(steps.size(), -1);
  max_slots_ = 0;
  int64_t rows = 0;
  for (auto& [page, members] : by_first) {
    if (members.size() < 2) continue;
    Group g;
    g.shared_pages.assign(size_t(num_layers), 0);
    bool any = false;
    for (int32_t l = 0; l < num_layers; ++l) {
      // Whole pages every member holds at the same place, before this step's row.
      const SequenceKv& first = *steps[size_t(members[0])].kv;
      int64_t shared = first.Slots(l) / block_size_;
      for (int32_t m : members) {
        const KvTable& a = first.tables[size_t(l)];
        const KvTable& b = steps[size_t(m)].kv->tables[size_t(l)];
        shared = std::min<int64_t>(shared, steps[size_t(m)].kv->Slots(l) / block_size_);
        int64_t same = 0;
        while (same < shared && a.pages[size_t(same)] == b.pages[size_t(same)]) ++same;
        shared = same;
      }
      g.shared_pages[size_t(l)] = shared >= kMinSharedPages ? int32_t(shared) : 0;
      any = any || shared >= kMinSharedPages;
    }
    if (!any) continue;
    g.steps = members;
    g.buf = rows;
    rows += int64_t(members.size()) * G_;
    for (size_t k = 0; k < members.size(); ++k) {
      group_of_[size_t(members[k])] = int32_t(groups_.size());
      member_at_[size_t(members[k])] = int32_t(k);
      for (int32_t l = 0; l < num_layers; ++l) {
        max_slots_ = std::max<int64_t>(max_slots_, steps[size_t(members[k])].kv->Slots(l) + 1);
      }
    }
    groups_.push_back(std::move(g));
  }
  if (groups_.empty()) return false;
  // rows: every group's members x G, for one kv head; the buffers hold every kv head's.
  q_.resize(size_t(rows * n_kv_ * hd_));
  out_.resize(size_t(rows * n_kv_ * hd_));
  stats_.resize(size_t(rows * n_kv_ * 2));
  probs_.resize(size_t(rows * n_kv_ * max_slots_));
  const int64_t tasks = int64_t(steps.size()) * n_kv_;
  part_out_.resize(size_t(tasks * 2 * G_ * hd_));
  part_stats_.resize(size_t(tasks * 2 * G_ * 2));
  own_probs_.resize(size_t(tasks * G_ * max_slots_));
  items_.assign(size_t(num_layers), {});
  for (int32_t l = 0; l < num_layers; ++l) {
    std::vector<Item>& items = items_[size_t(l)];
    // The long walks first, so the threads that take them start early.
    for (int32_t g = 0; g < int32_t(groups_.size()); ++g) {
      if (SharedSlots(l, g) == 0) continue;
      for (int32_t h = 0; h < n_kv_; ++h) items.push_back({g, h, -1});
    }
    for (int64_t t = 0; t < tasks; ++t) items.push_back({-1, 0, t});
  }
  return true;
}

bool SharedPrefixAttention::Member(int32_t layer, int64_t task) const {
  const int32_t g = group_of_[size_t(task / n_kv_)];
  return g >= 0 && SharedSlots(layer, g) > 0;
}

void SharedPrefixAttention::AttendShared(int32_t layer, int32_t g, int32_t h, const float* qkv,
                                         int64_t qkv_stride, std::span<const int64_t> first_token,
                                         KvCache& cache, std::span<const SequenceStep> steps) {
  const Group& group = groups_[size_t(g)];
  const int32_t members = int32_t(group.steps.size());
  const int64_t row0 = (group.buf * n_kv_ + int64_t(h) * members * G_);
  float* q = q_.data() + row0 * hd_;
  for (int32_t k = 0; k < members; ++k) {  // member k's G query heads of kv head h
    const float* from = qkv + first_token[size_t(group.steps[size_t(k)])] * qkv_stride +
                        int64_t(h) * G_ * hd_;
    std::memcpy(q + int64_t(k) * G_ * hd_, from, sizeof(float) * size_t(G_) * size_t(hd_));
  }
  const int32_t slots = SharedSlots(layer, g);
  cpu::AttentionArgs a;
  a.kv = cache.View(*steps[size_t(group.steps[0])].kv, layer, h, slots);
  a.num_old = slots - 1;  // the one "query" (every member's heads) sees every shared slot
  a.num_q = 1;
  a.group = members * G_;
  a.q = q;
  a.q_stride = int64_t(a.group) * hd_;
  a.out = out_.data() + row0 * hd_;
  a.out_stride = a.q_stride;
  a.part_stats = stats_.data() + row0 * 2;
  cpu::PagedAttention(a, probs_.data() + row0 * max_slots_);
  std::atomic_ref<int64_t>(walks_).fetch_add(1, std::memory_order_relaxed);
}

void SharedPrefixAttention::AttendOwn(int32_t layer, int64_t task, const cpu::AttentionArgs& a) {
  const int32_t g = group_of_[size_t(task / n_kv_)];
  const int32_t bounds[3] = {0, SharedSlots(layer, g), a.kv.num_slots};
  cpu::AttentionArgs own = cpu::PartArgs(a, bounds, 1, part_out_.data() + task * 2 * G_ * hd_,
                                         part_stats_.data() + task * 2 * G_ * 2);
  cpu::PagedAttention(own, own_probs_.data() + task * G_ * max_slots_);
}

void SharedPrefixAttention::Combine(int32_t layer, int64_t task, const cpu::AttentionArgs& a) {
  const int32_t step = int32_t(task / n_kv_), h = int32_t(task % n_kv_);
  const int32_t g = group_of_[size_t(step)];
  const Group& group = groups_[size_t(g)];
  const int32_t members = int32_t(group.steps.size());
  const int32_t shared = SharedSlots(layer, g);
  const int32_t bounds[3] = {0, shared, a.kv.num_slots};
  // Part 0 is this member's rows of the walk: its output and statistics rows, and in the walk's
  // probabilities ([members x G][shared], from the walk's scratch) its G rows.
  const int64_t row0 = group.buf * n_kv_ + int64_t(h) * members * G_;
  const int64_t member = member_at_[size_t(step)];
  const int64_t row = row0 + member * G_;
  float* part_out = part_out_.data() + task * 2 * G_ * hd_;
  float* part_stats = part_stats_.data() + task * 2 * G_ * 2;
  std::memcpy(part_out, out_.data() + row * hd_, sizeof(float) * size_t(G_) * size_t(hd_));
  std::memcpy(part_stats, stats_.data() + row * 2, sizeof(float) * size_t(G_) * 2);
  const float* probs[2] = {probs_.data() + row0 * max_slots_ + member * G_ * shared,
                           own_probs_.data() + task * G_ * max_slots_};
  thread_local std::vector<float> scratch;
  scratch.resize(size_t(cpu::AttentionScratchFloats(a.kv.num_slots, G_, 1)));
  cpu::CombineAttentionParts(a, bounds, 2, part_out, part_stats, probs, scratch.data());
}

}  // namespace heavykv
