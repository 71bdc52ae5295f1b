#include "engine/grammar/automaton.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace heavykv::grammar {

// ---- TokenVocabulary ----

std::shared_ptr<const TokenVocabulary> TokenVocabulary::FromTokenizer(const TextTokenizer& t) {
  auto v = std::make_shared<TokenVocabulary>();
  const int32_t n = t.vocab_size();
  v->bytes_.resize(n);
  v->kind_.assign(n, kText);
  for (int32_t id = 0; id < n; ++id) {
    if (t.IsEndOfGeneration(id)) {
      v->kind_[id] = kEog;
      v->eog_.push_back(id);
      continue;
    }
    if (t.IsControl(id)) {
      v->kind_[id] = kNever;
      continue;
    }
    v->bytes_[id] = t.Decode(-1, id);  // no BOS before it: SentencePiece keeps its space
    if (v->bytes_[id].empty()) v->kind_[id] = kNever;
  }
  v->Build();
  return v;
}

std::shared_ptr<const TokenVocabulary> TokenVocabulary::FromBytes(std::vector<std::string> bytes,
                                                                  std::vector<int32_t> eog,
                                                                  std::vector<int32_t> control) {
  auto v = std::make_shared<TokenVocabulary>();
  v->kind_.assign(bytes.size(), kText);
  v->bytes_ = std::move(bytes);
  for (int32_t id : control) v->kind_[id] = kNever;
  for (int32_t id : eog) v->kind_[id] = kEog;
  for (size_t id = 0; id < v->bytes_.size(); ++id) {
    if (v->kind_[id] == kEog) {
      v->eog_.push_back(int32_t(id));
      v->bytes_[id].clear();
    } else if (v->bytes_[id].empty()) {
      v->kind_[id] = kNever;
    }
  }
  v->Build();
  return v;
}

void TokenVocabulary::Build() {
  // FNV-1a over every token's kind and bytes.
  uint64_t h = 1469598103934665603ull;
  const auto mix = [&h](uint8_t c) { h = (h ^ c) * 1099511628211ull; };
  for (size_t id = 0; id < bytes_.size(); ++id) {
    mix(kind_[id]);
    for (char c : bytes_[id]) mix(uint8_t(c));
    mix(0xff);
  }
  fingerprint_ = h;

  // Text tokens sorted by bytes: a trie's depth-first order.
  std::vector<int32_t> order;
  for (int32_t id = 0; id < size(); ++id) {
    if (kind_[id] == kText) order.push_back(id);
  }
  std::sort(order.begin(), order.end(), [this](int32_t a, int32_t b) {
    return bytes_[a] != bytes_[b] ? bytes_[a] < bytes_[b] : a < b;
  });
  dfs_tokens_ = order;
  // Build the nodes recursively over [lo, hi) of `order` sharing a prefix of length `depth`.
  struct Builder {
    TokenVocabulary& v;
    const std::vector<int32_t>& order;
    // Returns the node index; its tokens are order[lo, hi).
    int32_t Make(size_t lo, size_t hi, size_t depth) {
      const int32_t id = int32_t(v.nodes_.size());
      v.nodes_.emplace_back();
      size_t i = lo;
      while (i < hi && v.bytes_[order[i]].size() == depth) ++i;
      v.nodes_[id].tok_begin = int32_t(lo);
      v.nodes_[id].tok_end = int32_t(i);
      v.nodes_[id].sub_end = int32_t(hi);
      // Children: runs of tokens with the same byte at `depth`.
      std::vector<std::pair<uint8_t, std::pair<size_t, size_t>>> runs;
      while (i < hi) {
        const uint8_t b = uint8_t(v.bytes_[order[i]][depth]);
        size_t j = i;
        while (j < hi && uint8_t(v.bytes_[order[j]][depth]) == b) ++j;
        runs.push_back({b, {i, j}});
        i = j;
      }
      std::vector<int32_t> kids;
      ByteSet below;
      for (const auto& [b, range] : runs) {
        const int32_t kid = Make(range.first, range.second, depth + 1);
        kids.push_back(kid);
        below.Add(b);
        below = below | v.nodes_[kid].below;
      }
      v.nodes_[id].below = below;
      v.nodes_[id].first_edge = int32_t(v.edge_byte_.size());
      v.nodes_[id].num_edges = int32_t(kids.size());
      for (size_t k = 0; k < kids.size(); ++k) {
        v.edge_byte_.push_back(runs[k].first);
        v.edge_node_.push_back(kids[k]);
      }
      return id;
    }
  };
  Builder{*this, dfs_tokens_}.Make(0, dfs_tokens_.size(), 0);
}

// ---- Automaton ----

Automaton::Automaton(std::shared_ptr<const Grammar> grammar,
                     std::shared_ptr<const TokenVocabulary> vocab, AutomatonLimits limits)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)), limits_(limits) {
  const Grammar& g = *grammar_;
  rule_starts_.resize(g.rules.size());
  for (size_t r = 0; r < g.rules.size(); ++r) {
    for (const auto& alt : g.rules[r]) {
      rule_starts_[r].push_back(int32_t(pos_kind_.size()));
      for (const Element& e : alt) {
        pos_kind_.push_back(e.kind == Element::Kind::kBytes ? 0 : 1);
        pos_arg_.push_back(e.index);
      }
      pos_kind_.push_back(2);
      pos_arg_.push_back(0);
    }
  }
  frames_.push_back({-1, 0});       // 0: the bottom of every stack
  states_.emplace_back();           // 0: dead
  state_ids_[std::string(1, '\0')] = 0;
}

void Automaton::Fail(absl::Status s) {
  if (status_.ok()) status_ = std::move(s);
}

int32_t Automaton::Intern(int32_t pos, int32_t parent) {
  const uint64_t key = (uint64_t(uint32_t(pos)) << 32) | uint32_t(parent);
  auto [it, fresh] = frame_ids_.try_emplace(key, int32_t(frames_.size()));
  if (fresh) {
    if (int64_t(frames_.size()) >= limits_.max_frames) {
      Fail(absl::ResourceExhaustedError(absl::StrCat(
          "the grammar's parser used more than ", limits_.max_frames, " stack frames")));
    }
    frames_.push_back({pos, parent});
  }
  return it->second;
}

// Adds to `out` the stacks reachable from `stack` without consuming a byte whose top is a
// byte-set element; `accepting` when the bottom is reached (the whole grammar may end here).
void Automaton::Expand(int32_t stack, std::vector<int32_t>& out, bool& accepting) {
  work_.clear();
  seen_.clear();
  work_.push_back(stack);
  while (!work_.empty()) {
    const int32_t s = work_.back();
    work_.pop_back();
    if (!seen_.try_emplace(s, true).second) continue;
    if (s == 0) {
      accepting = true;
      continue;
    }
    const Frame f = frames_[s];
    switch (pos_kind_[f.pos]) {
      case 0:
        out.push_back(s);
        break;
      case 2:
        work_.push_back(f.parent);  // its top is already the return position
        break;
      case 1: {
        const int32_t rule = pos_arg_[f.pos];
        // A call in tail position returns straight to the caller's caller.
        const int32_t base = pos_kind_[f.pos + 1] == 2 ? f.parent : Intern(f.pos + 1, f.parent);
        for (int32_t start : rule_starts_[rule]) work_.push_back(Intern(start, base));
        break;
      }
    }
  }
}

int32_t Automaton::InternState(std::vector<int32_t> stacks, bool accepting) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  if (stacks.empty() && !accepting) return kDead;
  if (int32_t(stacks.size()) > limits_.max_stacks_per_state) {
    Fail(absl::ResourceExhaustedError(absl::StrCat(
        "the grammar is too ambiguous: more than ", limits_.max_stacks_per_state,
        " parses are open at once")));
    return kDead;
  }
  std::string key(1, accepting ? '\1' : '\2');
  key.append(reinterpret_cast<const char*>(stacks.data()), stacks.size() * sizeof(int32_t));
  auto [it, fresh] = state_ids_.try_emplace(std::move(key), int32_t(states_.size()));
  if (fresh) {
    State& st = states_.emplace_back();
    st.stacks = std::move(stacks);
    st.accepting = accepting;
  }
  return it->second;
}

int32_t Automaton::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (start_ >= 0) return start_;
  std::vector<int32_t> stacks;
  bool accepting = false;
  for (int32_t p : rule_starts_[grammar_->root]) Expand(Intern(p, 0), stacks, accepting);
  start_ = status_.ok() ? InternState(std::move(stacks), accepting) : kDead;
  return start_;
}

int32_t Automaton::StepLocked(int32_t state, uint8_t byte) {
  if (state == kDead) return kDead;
  State* st = &states_[state];
  if (st->next == nullptr) {
    st->next = std::make_unique<std::array<int32_t, 256>>();
    st->next->fill(-1);
  }
  if (int32_t n = (*st->next)[byte]; n >= 0) return n;
  std::vector<int32_t> out;
  bool accepting = false;
  const std::vector<int32_t> stacks = st->stacks;  // states_ may grow below
  for (int32_t s : stacks) {
    const Frame f = frames_[s];
    if (!grammar_->byte_sets[pos_arg_[f.pos]].Has(byte)) continue;
    Expand(Intern(f.pos + 1, f.parent), out, accepting);
  }
  const int32_t n = status_.ok() ? InternState(std::move(out), accepting) : kDead;
  if (status_.ok()) (*states_[state].next)[byte] = n;
  return n;
}

int32_t Automaton::Step(int32_t state, uint8_t byte) {
  std::lock_guard<std::mutex> lock(mu_);
  return StepLocked(state, byte);
}

int32_t Automaton::StepBytes(int32_t state, std::string_view bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  for (char c : bytes) {
    state = StepLocked(state, uint8_t(c));
    if (state == kDead) break;
  }
  return state;
}

int32_t Automaton::StepToken(int32_t state, int32_t token) {
  if (vocab_ == nullptr || token < 0 || token >= vocab_->size() || !vocab_->IsText(token)) {
    return kDead;
  }
  return StepBytes(state, vocab_->bytes(token));
}

bool Automaton::Accepting(int32_t state) {
  std::lock_guard<std::mutex> lock(mu_);
  return states_[state].accepting;
}

bool Automaton::CanContinue(int32_t state) {
  std::lock_guard<std::mutex> lock(mu_);
  return !states_[state].stacks.empty();
}

absl::Status Automaton::status() {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

int64_t Automaton::num_states() {
  std::lock_guard<std::mutex> lock(mu_);
  return int64_t(states_.size());
}

int64_t Automaton::num_frames() {
  std::lock_guard<std::mutex> lock(mu_);
  return int64_t(frames_.size());
}

const ByteSet& Automaton::LoopLocked(int32_t state) {
  if (states_[state].loop == nullptr) {
    ByteSet loop;
    for (int b = 0; b < 256; ++b) {
      if (StepLocked(state, uint8_t(b)) == state) loop.Add(uint8_t(b));
    }
    states_[state].loop = std::make_unique<ByteSet>(loop);
  }
  return *states_[state].loop;
}

// Marks the tokens below trie `node` (reached in `state`, not dead) that fit.
void Automaton::Walk(int32_t node, int32_t state, std::vector<uint64_t>& words) {
  const TokenVocabulary& v = *vocab_;
  const auto& nodes = v.nodes();
  const auto& dfs = v.dfs_tokens();
  const auto mark = [&](int32_t from, int32_t to) {
    for (int32_t i = from; i < to; ++i) {
      const int32_t t = dfs[i];
      words[t >> 6] |= uint64_t{1} << (t & 63);
    }
  };
  const TokenVocabulary::Node& n = nodes[node];
  for (int32_t e = n.first_edge; e < n.first_edge + n.num_edges; ++e) {
    const int32_t next = StepLocked(state, v.edge_byte()[e]);
    if (next == kDead) continue;
    const int32_t kid = v.edge_node()[e];
    const TokenVocabulary::Node& k = nodes[kid];
    if (k.num_edges == 0) {
      mark(k.tok_begin, k.sub_end);
      continue;
    }
    // A big subtree whose bytes all loop on the state: every token in it fits.
    if (k.sub_end - k.tok_begin > 16 && LoopLocked(next).Contains(k.below)) {
      mark(k.tok_begin, k.sub_end);
      continue;
    }
    mark(k.tok_begin, k.tok_end);
    Walk(kid, next, words);
    if (!status_.ok()) return;
  }
}

void Automaton::FillMask(int32_t state, std::span<uint64_t> words) {
  std::lock_guard<std::mutex> lock(mu_);
  std::fill(words.begin(), words.end(), 0);
  if (vocab_ == nullptr || state == kDead) return;
  if (const auto& cached = states_[state].mask; cached != nullptr) {
    std::copy(cached->begin(), cached->end(), words.begin());
    return;
  }
  std::vector<uint64_t> mask(size_t(vocab_->num_words()), 0);
  if (!states_[state].stacks.empty()) Walk(0, state, mask);
  if (!status_.ok()) return;  // past a limit: nothing fits (the caller reports status())
  if (states_[state].accepting) {
    for (int32_t t : vocab_->eog_ids()) mask[t >> 6] |= uint64_t{1} << (t & 63);
  }
  std::copy(mask.begin(), mask.end(), words.begin());
  const int64_t bytes = int64_t(mask.size() * sizeof(uint64_t));
  if (mask_bytes_ + bytes > limits_.max_mask_cache_bytes) {  // full: start again
    for (State& s : states_) s.mask.reset();
    mask_bytes_ = 0;
  }
  mask_bytes_ += bytes;
  states_[state].mask = std::make_shared<const std::vector<uint64_t>>(std::move(mask));
}

}  // namespace heavykv::grammar
