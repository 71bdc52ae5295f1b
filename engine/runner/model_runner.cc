#include "engine/runner/model_runner.h"

#include <algorithm>
#include <vector>

#include <omp.h>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/paged_attention.h"

namespace heavykv {

KvShape KvShapeFor(const ModelConfig& config, int32_t block_size) {
  KvShape s;
  s.num_layers = config.num_layers;
  s.num_kv_heads = config.num_kv_heads;
  s.head_dim = config.head_dim();
  s.block_size = block_size;
  s.table_per_layer = true;  // the host layout: a block table per layer
  return s;
}

ModelRunner::ModelRunner(const Model& model, KvCache* cache) : model_(model), cache_(cache) {
  team_weights_ = !model.layers.empty();
  for (const LayerWeights& w : model.layers) {
    for (const cpu::Linear* m : {&w.wqkv, &w.wo, &w.w13, &w.w2}) {
      team_weights_ = team_weights_ && m->TeamCapable(1);
    }
  }
  team_classifier_ = model.classifier.TeamCapable(1);
}

namespace {

// Rotates the key of `slot` forward by `delta` positions (RoPE rotations compose).
void RotateKey(const PagedKvHead& kv, int32_t slot, int32_t delta, const cpu::RopeParams& rope) {
  const int32_t hd = kv.head_dim;
  thread_local std::vector<float> row;
  row.resize(hd);
  kv.LoadK(slot, row.data());
  cpu::Rope(row.data(), 1, hd, hd, &delta, rope);
  kv.StoreK(slot, row.data());  // rounded to bf16, or quantized again
}

// Brings the pinned prefix's keys of one (layer, kv head) from shift_from to shift_to.
void ShiftPinnedKeys(const PagedKvHead& kv, int32_t old, int32_t n, int32_t pinned,
                     int32_t shift_from, int32_t shift_to, const cpu::RopeParams& rope) {
  // The pinned tokens never move (the victims are the others), so they hold the first slots; a
  // slot appended in this step was rotated at its own position only.
  for (int32_t s = 0; s < std::min(old + n, pinned); ++s) {
    if (kv.Pos(s) >= pinned) continue;
    const int32_t delta = shift_to - (s < old ? shift_from : 0);
    if (delta != 0) RotateKey(kv, s, delta, rope);
  }
}

// One layer's split-K decode attention (kernels/cpu/paged_attention.h CombineAttentionParts):
// per (sequence, kv head) task its part bounds, and the parts' outputs, softmax statistics and
// unnormalised probabilities. Kept across the layers of a step, so the buffers only grow.
struct SplitPlan {
  std::vector<cpu::AttentionArgs> args;            // per task, its whole-context arguments
  std::vector<std::pair<int64_t, int32_t>> items;  // (task, part) pairs to attend
  std::vector<int32_t> first;                      // per task: where its bounds start
  std::vector<int32_t> bounds;                     // per task: parts + 1 slot bounds
  std::vector<int64_t> probs_at;                   // per task: where its probabilities start
  std::vector<float> out, stats, probs;
  int32_t group = 0, head_dim = 0;

  // Plans layer `layer` of a decode step; false (and nothing planned) where every task would
  // be one part (AttentionParts), or when not `allowed`.
  bool Plan(std::span<const SequenceStep> steps, int32_t layer, int32_t n_kv, int32_t G,
            int32_t hd, const KvCache& cache, bool allowed) {
    if (!allowed) return false;
    const int64_t tasks = int64_t(steps.size()) * n_kv;
    const int32_t threads = omp_get_max_threads();
    first.assign(tasks + 1, 0);
    bounds.clear();
    items.clear();
    bool any = false;
    for (int64_t t = 0; t < tasks; ++t) {
      const SequenceKv& kv = *steps[t / n_kv].kv;
      const int32_t slots = kv.Slots(layer) + 1;  // the new token's included
      const int32_t bs = cache.BlockSize(kv);     // parts start on page bounds
      const int32_t parts = AttentionParts(tasks, threads, slots);
      any = any || parts > 1;
      first[t] = static_cast<int32_t>(bounds.size());
      for (int32_t j = 0; j < parts; ++j) {
        bounds.push_back(j == 0 ? 0 : int32_t(int64_t(j) * slots / parts / bs * bs));
        items.emplace_back(t, j);
      }
      bounds.push_back(slots);
    }
    first[tasks] = static_cast<int32_t>(bounds.size());
    if (!any) return false;
    group = G;
    head_dim = hd;
    args.resize(tasks);
    out.resize(items.size() * G * hd);
    stats.resize(items.size() * G * 2);
    probs_at.assign(tasks + 1, 0);  // G x slots per task
    for (int64_t t = 0; t < tasks; ++t) {
      probs_at[t + 1] = probs_at[t] + int64_t(G) * Bounds(t)[Parts(t)];
    }
    probs.resize(probs_at[tasks]);
    return true;
  }
  int32_t Parts(int64_t t) const { return first[t + 1] - first[t] - 1; }
  const int32_t* Bounds(int64_t t) const { return bounds.data() + first[t]; }
  // A task's part rows start at its first bound's index less one per earlier task.
  int64_t FirstPart(int64_t t) const { return first[t] - t; }
  float* Out(int64_t t) { return out.data() + FirstPart(t) * group * head_dim; }
  float* Stats(int64_t t) { return stats.data() + FirstPart(t) * group * 2; }
  float* Probs(int64_t t, int32_t j) {
    return probs.data() + probs_at[t] + int64_t(group) * Bounds(t)[j];
  }
};

}  // namespace

int32_t AttentionParts(int64_t tasks, int32_t threads, int32_t slots) {
  if (tasks <= 0 || tasks >= threads) return 1;
  const int64_t want = (threads + tasks - 1) / tasks;
  const int64_t most = slots / kMinAttentionPartSlots;
  return static_cast<int32_t>(std::max<int64_t>(1, std::min<int64_t>(want, most)));
}

absl::StatusOr<std::span<const float>> ModelRunner::Forward(
    std::span<const SequenceStep> steps) {
  const ModelConfig& c = model_.config;
  const int64_t dim = c.dim, q_dim = c.q_dim(), kv_dim = c.kv_dim(), qkv_dim = c.qkv_dim(),
                hid = c.hidden_dim;
  const int32_t hd = c.head_dim(), G = c.group_size(), n_kv = c.num_kv_heads;

  // Validate the plan and reserve the slots of the new tokens, before touching any state.
  int64_t T = 0, rows = 0;
  if (absl::Status s = ValidateSteps(c, steps, &T, &rows, /*past_context=*/true); !s.ok()) {
    return s;
  }
  std::vector<int64_t> first_token(steps.size());
  for (size_t i = 1; i < steps.size(); ++i) {
    first_token[i] = first_token[i - 1] + static_cast<int64_t>(steps[i - 1].tokens.size());
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    absl::Status s = cache_->Reserve(*steps[i].kv, steps[i].tokens.size());
    if (!s.ok()) {
      // All or nothing: give back what this call reserved for the sequences before it.
      for (size_t j = 0; j < i; ++j) cache_->Unreserve(*steps[j].kv);
      return s;
    }
  }

  x_.resize(T * dim);
  xb_.resize(T * dim);
  qkv_.resize(T * qkv_dim);
  att_.resize(T * q_dim);
  hb_.resize(T * 2 * hid);
  hb2_.resize(T * hid);
  pos_.resize(T);
  for (size_t i = 0; i < steps.size(); ++i) {
    for (size_t j = 0; j < steps[i].tokens.size(); ++j) {
      const int64_t t = first_token[i] + j;
      pos_[t] = steps[i].start_pos + static_cast<int32_t>(j);
      model_.EmbedToken(steps[i].tokens[j], &x_[t * dim]);
    }
  }

  const int64_t num_tasks = int64_t(steps.size()) * n_kv;
  // Attention multiply-adds of the step, to decide whether forking threads pays off.
  int64_t attention_work = 0;
  for (const SequenceStep& st : steps) {
    attention_work += (int64_t(st.kv->MeanSlots()) + st.tokens.size()) * st.tokens.size();
  }
  attention_work *= int64_t(c.num_heads) * hd;
  const bool parallel_attention = num_tasks > 1 && attention_work > (int64_t(1) << 16);
  // Split-K serves steps of one token per sequence, with enough work to fork threads for.
  bool split_allowed = split_attention_ && attention_work > (int64_t(1) << 16);
  for (const SequenceStep& st : steps) {
    // Not with a demoted store (MiKV): its attention is two parts already.
    const bool demotes = st.kv->policy != nullptr && st.kv->policy->demote() != KvQuant::kNone;
    split_allowed = split_allowed && st.tokens.size() == 1 && !demotes;
  }
  SplitPlan split;
  // Decode steps that share their first pages (n choices; prefix-cache loans) attend them in one
  // walk (engine/runner/shared_prefix.h); their own slots after, then the two are combined.
  const bool shared = shared_prefix_ && shared_.Plan(steps, *cache_, c.num_layers, n_kv, G, hd);
  std::vector<cpu::AttentionArgs> shared_args(shared ? size_t(num_tasks) : 0);
  cpu::RopeParams rope;
  rope.head_dim = hd;
  rope.theta = c.rope_theta;
  rope.neox = c.rope_style == RopeStyle::kNeox;
  rope.freq_factors = model_.rope_freqs.empty() ? nullptr : model_.rope_freqs.data();

  // Endless streaming (StreamsPastContext): a step past the context keeps every query within
  // seq_len - 1 positions of its keys. The recent tokens are contiguous up to the newest, so their
  // distances are their own; the pinned prefix (sink's first tokens) has its keys rotated forward
  // by pinned_shift. When the oldest pinned key would fall more than seq_len - 1 behind, the shift
  // jumps so that the prefix sits just before the oldest recent token (StreamingLLM's positions
  // within the cache), then stays until the distance has grown back to seq_len - 1: the keys are
  // re-rotated once per (seq_len - budget) positions, not every step (each rotation of bf16 keys
  // rounds them again).
  // The step's new shift per sequence; the old one stays in SequenceKv::pinned_shift until the
  // end of the step.
  std::vector<int32_t> pinned(steps.size(), 0), shift_to(steps.size(), 0);
  for (size_t i = 0; i < steps.size(); ++i) {
    const SequenceStep& st = steps[i];
    const int32_t n = static_cast<int32_t>(st.tokens.size());
    const int32_t newest = st.start_pos + n - 1;
    shift_to[i] = st.kv->pinned_shift;
    if (newest <= c.seq_len - 1) continue;
    pinned[i] = *st.kv->policy->PinnedPrefix(st.kv->budget);  // ValidateSteps checked it
    if (newest - shift_to[i] > c.seq_len - 1) shift_to[i] = newest - (st.kv->budget + n - 1);
  }
  // Squeeze layer budgets (memory/layer_budgets.h): until its budgets are set, a sequence's steps
  // measure, per layer, the cosine similarity of each token's residual stream before and after
  // attention (summed here; KvCache::AddLayerSimilarity averages and decides).
  std::vector<size_t> measured;
  for (size_t i = 0; i < steps.size(); ++i) {
    const SequenceKv& kv = *steps[i].kv;
    if (kv.policy != nullptr && kv.policy->layer_budgets() == LayerBudgets::kSqueeze &&
        !kv.layers_measured) {
      measured.push_back(i);
    }
  }
  std::vector<double> similarity(measured.size() * c.num_layers, 0.0);
  std::vector<float> before;
  // Appends task's new K/V rows to its (layer, kv head) and returns its attention arguments.
  auto prepare = [&](int32_t l, int64_t task) {
    const SequenceStep& st = steps[task / n_kv];
    const int32_t h = static_cast<int32_t>(task % n_kv);
    const int32_t n = static_cast<int32_t>(st.tokens.size());
    const int32_t old = st.kv->Slots(l);
    const int64_t t0 = first_token[task / n_kv];
    PagedKvHead kv = cache_->View(*st.kv, l, h, old + n);
    const ChannelSpec channel =
        st.kv->policy != nullptr ? st.kv->policy->channel() : ChannelSpec{};
    for (int32_t i = 0; i < n; ++i) {  // append this step's K/V rows to the head
      const float* row = &qkv_[(t0 + i) * qkv_dim];
      const float* k_row = row + q_dim + int64_t(h) * hd;
      kv.StoreRows(old + i, k_row, row + q_dim + kv_dim + int64_t(h) * hd);
      kv.Pos(old + i) = st.start_pos + i;
      kv.Score(old + i) =
          channel.kind == SlotChannel::kNegKeyNorm ? -cpu::L2Norm(k_row, hd) : 0.0f;
    }
    if (pinned[task / n_kv] > 0) {
      ShiftPinnedKeys(kv, old, n, pinned[task / n_kv], st.kv->pinned_shift,
                      shift_to[task / n_kv], rope);
    }
    cpu::AttentionArgs a;
    a.kv = kv;
    a.num_old = old;
    a.num_q = n;
    a.group = G;
    a.q = &qkv_[t0 * qkv_dim + int64_t(h) * G * hd];
    a.q_stride = qkv_dim;
    a.out = &att_[t0 * q_dim + int64_t(h) * G * hd];
    a.out_stride = q_dim;
    if (AttentionWrites(channel.kind)) a.channel = channel;
    // The score update reads the scores, EvictHead the positions (and scores) after it.
    const bool evicts = KeptAfterStep(*st.kv, l, old + n, kv.block_size) < old + n;
    const bool scores = channel.kind != SlotChannel::kNone;
    if (evicts || scores) kv.PrefetchMeta(evicts, scores);
    return a;
  };
  // A task's attention: over its cache, and over its demoted store too where it has one (MiKV).
  auto attend = [&](int32_t l, int64_t task, const cpu::AttentionArgs& a) {
    thread_local std::vector<float> scratch;
    scratch.resize(cpu::AttentionScratchFloats(a.kv.num_slots, G, a.num_q));
    const SequenceKv& kv = *steps[task / n_kv].kv;
    if (kv.DemotedSlots(l) > 0) {
      const PagedKvHead demoted = cache_->DemotedView(kv, l, static_cast<int32_t>(task % n_kv));
      cpu::PagedAttentionWithDemoted(a, demoted, scratch.data());
    } else {
      cpu::PagedAttention(a, scratch.data());
    }
  };
  auto evict = [&](int32_t l, int64_t task, const cpu::AttentionArgs& a) {
    const SequenceStep& st = steps[task / n_kv];
    const int32_t n = static_cast<int32_t>(st.tokens.size());
    cache_->EvictHead(*st.kv, l, static_cast<int32_t>(task % n_kv), a.kv.num_slots,
                      st.start_pos + n - 1, n);
  };
  // The shared-prefix phases' units (SharedPrefixAttention::Items) and each task's end.
  auto attend_item = [&](int32_t l, const SharedPrefixAttention::Item& item) {
    if (item.group >= 0) {
      shared_.AttendShared(l, item.group, item.head, qkv_.data(), qkv_dim, first_token, *cache_,
                           steps);
    } else if (shared_.Member(l, item.task)) {
      shared_.AttendOwn(l, item.task, shared_args[size_t(item.task)]);
    } else {
      attend(l, item.task, shared_args[size_t(item.task)]);
    }
  };
  auto finish_task = [&](int32_t l, int64_t task) {
    const cpu::AttentionArgs& a = shared_args[size_t(task)];
    if (shared_.Member(l, task)) shared_.Combine(l, task, a);
    evict(l, task, a);
  };
  // The final norm of the rows whose logits are wanted, into out[rows][dim]; then the classifier.
  auto final_norm = [&](float* out) {
    int64_t r = 0;
    for (size_t i = 0; i < steps.size(); ++i) {
      const int64_t n = steps[i].tokens.size();
      const int64_t from = steps[i].all_logits ? first_token[i] : first_token[i] + n - 1;
      const int64_t count = steps[i].all_logits ? n : 1;
      cpu::RmsNorm(&x_[from * dim], model_.rms_final.data(), out + r * dim, count, dim,
                   c.rms_norm_eps);
      r += count;
    }
  };
  logits_.resize(rows * c.vocab_size);
  bool classified = false;
  // A decode step of a few tokens on quantized weights runs as one parallel region (the team
  // path; model_runner.h): fewer forks, no serial stretch between the matrices, and rows shared
  // out as the threads come. Split-K (fewer pairs than threads) and squeeze's measuring steps
  // take the general path below.
  const int32_t threads = omp_get_max_threads();
  if (team_ && team_weights_ && threads > 1 && T <= kTeamMaxTokens && num_tasks >= threads &&
      measured.empty()) {
    // Bias, q/k norms and rotation of one task's heads (the general path does the whole step's
    // at once, with the same arithmetic per head).
    rope_angles_.resize(T * hd);
    cpu::RopeAngles(pos_.data(), T, rope, rope_angles_.data());
    auto prepare_heads = [&](const LayerWeights& w, int64_t task) {
      const int64_t h = task % n_kv, t0 = first_token[task / n_kv];
      const int64_t n = static_cast<int64_t>(steps[task / n_kv].tokens.size());
      const int64_t q0 = h * G * hd, k0 = q_dim + h * hd, v0 = q_dim + kv_dim + h * hd;
      for (int64_t t = t0; t < t0 + n; ++t) {
        float* row = &qkv_[t * qkv_dim];
        if (!w.bqkv.empty()) {
          cpu::Add(row + q0, w.bqkv.data() + q0, G * hd);
          cpu::Add(row + k0, w.bqkv.data() + k0, hd);
          cpu::Add(row + v0, w.bqkv.data() + v0, hd);
        }
        if (!w.q_norm.empty()) {
          cpu::RmsNorm(row + q0, w.q_norm.data(), row + q0, G, hd, c.rms_norm_eps);
          cpu::RmsNorm(row + k0, w.k_norm.data(), row + k0, 1, hd, c.rms_norm_eps);
        }
        cpu::RopeWithAngles(row + q0, 1, qkv_dim, G * hd, &rope_angles_[t * hd], rope);
        cpu::RopeWithAngles(row + k0, 1, qkv_dim, hd, &rope_angles_[t * hd], rope);
      }
    };
    team_xb_.resize(int64_t(threads) * T * dim);
#pragma omp parallel num_threads(threads)
    {
      const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
      float* xb = team_xb_.data() + int64_t(tid) * T * dim;  // this thread's normalised copy
      for (int32_t l = 0; l < c.num_layers; ++l) {
        const LayerWeights& w = model_.layers[l];
        cpu::RmsNorm(x_.data(), w.rms_att.data(), xb, T, dim, c.rms_norm_eps);
        w.wqkv.MultiplyTeam(xb, qkv_.data(), T, qkv_dim, /*accumulate=*/false);
#pragma omp barrier
        if (shared) {  // three phases: rows appended; walks and parts; combines
#pragma omp for schedule(dynamic, 1)
          for (int64_t task = 0; task < num_tasks; ++task) {
            prepare_heads(w, task);
            shared_args[size_t(task)] = prepare(l, task);
          }
          const std::vector<SharedPrefixAttention::Item>& items = shared_.Items(l);
#pragma omp for schedule(dynamic, 1)
          for (int64_t i = 0; i < int64_t(items.size()); ++i) attend_item(l, items[size_t(i)]);
#pragma omp for schedule(dynamic, 1)
          for (int64_t task = 0; task < num_tasks; ++task) finish_task(l, task);
        } else {
#pragma omp for schedule(dynamic, 1)
          for (int64_t task = 0; task < num_tasks; ++task) {
            prepare_heads(w, task);
            const cpu::AttentionArgs a = prepare(l, task);
            attend(l, task, a);
            evict(l, task, a);
          }
        }
        w.wo.MultiplyTeam(att_.data(), x_.data(), T, dim, /*accumulate=*/true);
#pragma omp barrier
        cpu::RmsNorm(x_.data(), w.rms_ffn.data(), xb, T, dim, c.rms_norm_eps);
        w.w13.MultiplyTeam(xb, hb_.data(), T, 2 * hid, /*accumulate=*/false);
#pragma omp barrier
        cpu::SwiGluColumns(hb_.data(), hb2_.data(), T, hid, hid * tid / nth,
                           hid * (tid + 1) / nth);
#pragma omp barrier
        w.w2.MultiplyTeam(hb2_.data(), x_.data(), T, dim, /*accumulate=*/true);
#pragma omp barrier
      }
      if (team_classifier_) {  // the region's end is the last barrier
        final_norm(xb);
        model_.classifier.MultiplyTeam(xb, logits_.data(), rows, c.vocab_size,
                                       /*accumulate=*/false);
      }
    }
    classified = team_classifier_;
    ++team_steps_;
  } else {
    for (int32_t l = 0; l < c.num_layers; ++l) {
      const LayerWeights& w = model_.layers[l];
      cpu::RmsNorm(x_.data(), w.rms_att.data(), xb_.data(), T, dim, c.rms_norm_eps);
      w.wqkv.Multiply(xb_.data(), qkv_.data(), T, qkv_dim, /*accumulate=*/false);
      if (!w.bqkv.empty()) {
        for (int64_t t = 0; t < T; ++t) cpu::Add(&qkv_[t * qkv_dim], w.bqkv.data(), qkv_dim);
      }
      if (!w.q_norm.empty()) {  // each head of q, then of k, normalised on its own
        for (int64_t t = 0; t < T; ++t) {
          float* row = &qkv_[t * qkv_dim];
          cpu::RmsNorm(row, w.q_norm.data(), row, c.num_heads, hd, c.rms_norm_eps);
          cpu::RmsNorm(row + q_dim, w.k_norm.data(), row + q_dim, n_kv, hd, c.rms_norm_eps);
        }
      }
      cpu::Rope(qkv_.data(), T, qkv_dim, q_dim + kv_dim, pos_.data(), rope);

      if (split.Plan(steps, l, n_kv, G, hd, *cache_, split_allowed)) {
        // Split-K: fewer (sequence, kv head) pairs than threads, so each decode query's context
        // is cut into parts that the threads attend at once, then combined per pair.
        std::vector<cpu::AttentionArgs>& args = split.args;
#pragma omp parallel for schedule(dynamic, 1)
        for (int64_t task = 0; task < num_tasks; ++task) args[task] = prepare(l, task);
#pragma omp parallel for schedule(dynamic, 1)
        for (int64_t item = 0; item < int64_t(split.items.size()); ++item) {
          const auto [task, j] = split.items[item];
          cpu::PagedAttention(cpu::PartArgs(args[task], split.Bounds(task), j, split.Out(task),
                                            split.Stats(task)),
                              split.Probs(task, j));
        }
#pragma omp parallel for schedule(dynamic, 1)
        for (int64_t task = 0; task < num_tasks; ++task) {
          const int32_t parts = split.Parts(task);
          std::vector<const float*> probs(parts);
          for (int32_t j = 0; j < parts; ++j) probs[j] = split.Probs(task, j);
          thread_local std::vector<float> scratch;
          scratch.resize(cpu::AttentionScratchFloats(args[task].kv.num_slots, G, 1));
          cpu::CombineAttentionParts(args[task], split.Bounds(task), parts, split.Out(task),
                                     split.Stats(task), probs.data(), scratch.data());
          evict(l, task, args[task]);
        }
        split_parts_ += int64_t(split.items.size());
      } else if (shared) {
#pragma omp parallel for schedule(dynamic, 1) if (parallel_attention)
        for (int64_t task = 0; task < num_tasks; ++task) shared_args[size_t(task)] = prepare(l, task);
        const std::vector<SharedPrefixAttention::Item>& items = shared_.Items(l);
#pragma omp parallel for schedule(dynamic, 1) if (parallel_attention)
        for (int64_t i = 0; i < int64_t(items.size()); ++i) attend_item(l, items[size_t(i)]);
#pragma omp parallel for schedule(dynamic, 1) if (parallel_attention)
        for (int64_t task = 0; task < num_tasks; ++task) finish_task(l, task);
      } else {
#pragma omp parallel for schedule(dynamic, 1) if (parallel_attention)
        for (int64_t task = 0; task < num_tasks; ++task) {
          const cpu::AttentionArgs a = prepare(l, task);
          attend(l, task, a);
          evict(l, task, a);
        }
      }

      if (!measured.empty()) before.assign(x_.begin(), x_.begin() + T * dim);
      w.wo.Multiply(att_.data(), x_.data(), T, dim, /*accumulate=*/true);
      for (size_t m = 0; m < measured.size(); ++m) {
        const SequenceStep& st = steps[measured[m]];
        double sum = 0;
        for (size_t j = 0; j < st.tokens.size(); ++j) {
          const int64_t row = (first_token[measured[m]] + j) * dim;
          sum += cpu::CosineSimilarity(&before[row], &x_[row], dim);
        }
        similarity[m * c.num_layers + l] = sum;
      }
      cpu::RmsNorm(x_.data(), w.rms_ffn.data(), xb_.data(), T, dim, c.rms_norm_eps);
      w.w13.Multiply(xb_.data(), hb_.data(), T, 2 * hid, /*accumulate=*/false);
      cpu::SwiGlu(hb_.data(), hb2_.data(), T, hid);
      w.w2.Multiply(hb2_.data(), x_.data(), T, dim, /*accumulate=*/true);
    }
  }

  for (size_t i = 0; i < steps.size(); ++i) {
    const SequenceStep& st = steps[i];
    cache_->CommitStep(*st.kv, static_cast<int32_t>(st.tokens.size()));
    cache_->SetPinnedShift(*st.kv, shift_to[i]);
  }
  for (size_t m = 0; m < measured.size(); ++m) {
    const SequenceStep& st = steps[measured[m]];
    const int32_t n = static_cast<int32_t>(st.tokens.size());
    cache_->AddLayerSimilarity(*st.kv, {&similarity[m * c.num_layers], size_t(c.num_layers)}, n,
                               st.start_pos + n - 1);
  }

  if (!classified) {
    final_norm(xb_.data());
    model_.classifier.Multiply(xb_.data(), logits_.data(), rows, c.vocab_size,
                              /*accumulate=*/false);
  }
  return std::span<const float>(logits_);
}

}  // namespace heavykv
