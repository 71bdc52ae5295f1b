#include "engine/grammar/automaton.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace heavykv::grammar {

// ---- TokenVocabulary ----

namespace {

// The bytes a UTF-8 sequence may continue with after `lead` and `seen` continuation bytes, and
// how many it still needs (0: `lead` is no lead byte of a valid sequence).
struct Utf8Step {
  uint8_t lo = 0x80, hi = 0xBF;
  int need = 0;
};
Utf8Step Utf8Next(uint8_t lead, int seen) {
  Utf8Step s;
  if (lead >= 0xC2 && lead <= 0xDF) {
    s.need = 1;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    s.need = 2;
    if (seen == 0 && lead == 0xE0) s.lo = 0xA0;
    if (seen == 0 && lead == 0xED) s.hi = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    s.need = 3;
    if (seen == 0 && lead == 0xF0) s.lo = 0x90;
    if (seen == 0 && lead == 0xF4) s.hi = 0x8F;
  }
  s.need -= seen;
  return s;
}

}  // namespace

// Whether `b` is valid UTF-8 from a character boundary, its last character possibly cut short.
bool ValidUtf8Prefix(std::string_view b) {
  for (size_t i = 0; i < b.size();) {
    const uint8_t lead = uint8_t(b[i]);
    if (lead < 0x80) {
      ++i;
      continue;
    }
    if (Utf8Next(lead, 0).need <= 0) return false;
    size_t k = 1;
    for (; i + k < b.size(); ++k) {
      const Utf8Step st = Utf8Next(lead, int(k) - 1);
      if (st.need <= 0) break;
      const uint8_t c = uint8_t(b[i + k]);
      if (c < st.lo || c > st.hi) return false;
    }
    i += k;
  }
  return true;
}

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
  // A node per distinct non-empty prefix, in the order of the sorted tokens: token k adds the
  // nodes of its bytes past the prefix it shares with token k-1.
  std::vector<int32_t> open;  // open[d-1]: the node at depth d on the current path
  const auto close_to = [&](size_t depth) {  // nodes deeper than `depth` end here
    while (open.size() > depth) {
      node_skip_[size_t(open.back())] = int32_t(node_byte_.size());
      open.pop_back();
    }
  };
  for (size_t k = 0; k < order.size(); ++k) {
    const std::string& t = bytes_[order[k]];
    size_t lcp = 0;
    if (k > 0) {
      const std::string& p = bytes_[order[k - 1]];
      while (lcp < p.size() && lcp < t.size() && p[lcp] == t[lcp]) ++lcp;
    }
    close_to(lcp);
    for (size_t d = lcp; d < t.size(); ++d) {
      open.push_back(int32_t(node_byte_.size()));
      node_byte_.push_back(uint8_t(t[d]));
      node_depth_.push_back(uint16_t(std::min<size_t>(d + 1, 65535)));
      node_skip_.push_back(0);
      node_tok_.push_back(int32_t(k));  // the first token at or under this node
    }
    max_depth_ = std::max(max_depth_, int32_t(t.size()));
  }
  close_to(0);
  node_tok_.push_back(int32_t(order.size()));
  // The bytes under each big node, from the deepest nodes up.
  node_below_.assign(node_byte_.size(), -1);
  std::vector<ByteSet> under(node_byte_.size());
  for (int32_t i = num_nodes() - 1; i >= 0; --i) {
    for (int32_t c = i + 1; c < node_skip_[size_t(i)]; c = node_skip_[size_t(c)]) {
      under[size_t(i)] = under[size_t(i)] | under[size_t(c)];
      under[size_t(i)].Add(node_byte_[size_t(c)]);
    }
    if (node_tok_[size_t(node_skip_[size_t(i)])] - node_tok_[size_t(i)] > 16) {
      node_below_[size_t(i)] = int32_t(below_.size());
      below_.push_back(under[size_t(i)]);
      bool utf8 = true;
      for (int32_t k = node_tok_[size_t(i)]; k < node_tok_[size_t(node_skip_[size_t(i)])] && utf8;
           ++k) {
        utf8 = ValidUtf8Prefix(std::string_view(bytes_[order[size_t(k)]]).substr(node_depth_[size_t(i)]));
      }
      below_utf8_.push_back(utf8);
    }
  }
}

std::pair<int32_t, size_t> TokenVocabulary::LongestPrefixToken(std::string_view text) const {
  std::pair<int32_t, size_t> best = {-1, 0};
  int32_t i = 0, end = num_nodes();  // the siblings at this depth: [i, end)
  for (size_t d = 0; d < text.size() && i < end; ++d) {
    while (i < end && node_byte_[size_t(i)] != uint8_t(text[d])) i = node_skip_[size_t(i)];
    if (i == end) break;
    if (node_tok_[size_t(i)] < node_tok_[size_t(i) + 1]) {  // a token's bytes end here
      best = {dfs_tokens_[size_t(node_tok_[size_t(i)])], d + 1};
    }
    end = node_skip_[size_t(i)];
    ++i;  // its first child, if any
  }
  return best;
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
  // Room for the states a typical constraint meets, so that growing seldom copies.
  states_.reserve(1024);
  next_.reserve(size_t(1024) * 256);
  row_.reserve(4096);
  frames_.reserve(4096);
  frames_.push_back({-1, 0});       // 0: the bottom of every stack
  states_.emplace_back();           // 0: dead
  next_.assign(256, kDead);         // the dead state stays dead: row 0
  row_.push_back(0);
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
void Automaton::Expand(std::vector<int32_t>& out, bool& accepting) {
  if (++closure_ == 0) {  // wrapped: forget every mark
    std::fill(seen_.begin(), seen_.end(), 0);
    closure_ = 1;
  }
  while (!work_.empty()) {
    const int32_t s = work_.back();
    work_.pop_back();
    if (size_t(s) >= seen_.size()) seen_.resize(std::max(frames_.size(), size_t(s) + 1), 0);
    if (seen_[size_t(s)] == closure_) continue;
    seen_[size_t(s)] = closure_;
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
  if (fresh && int32_t(states_.size()) >= limits_.max_states) {
    state_ids_.erase(it);
    Fail(absl::ResourceExhaustedError(absl::StrCat(
        "the grammar's parser met more than ", limits_.max_states, " distinct states")));
    return kDead;
  }
  if (fresh) {
    State& st = states_.emplace_back();
    st.stacks = std::move(stacks);
    st.accepting = accepting;
    row_.push_back(-1);  // its row of transitions comes with its first step
  }
  return it->second;
}

int32_t Automaton::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (start_ >= 0) return start_;
  std::vector<int32_t> stacks;
  bool accepting = false;
  work_.clear();
  for (int32_t p : rule_starts_[grammar_->root]) work_.push_back(Intern(p, 0));
  Expand(stacks, accepting);
  start_ = status_.ok() ? InternState(std::move(stacks), accepting) : kDead;
  return start_;
}

int32_t Automaton::StepLocked(int32_t state, uint8_t byte) {
  if (row_[size_t(state)] >= 0) {
    if (int32_t n = next_[size_t(row_[size_t(state)]) * 256 + byte]; n >= 0) return n;
  }
  const std::vector<int32_t> stacks = states_[state].stacks;  // states_ may grow below
  // Bytes that the same stacks take lead to the same state: one closure per such class (a
  // string's characters are one class, a digit state's digits another), every byte of the
  // class filled at once. Past 64 stacks, the byte alone.
  const size_t k = std::min<size_t>(stacks.size(), 64);
  const auto signature = [&](int b) {
    uint64_t sig = 0;
    for (size_t i = 0; i < k; ++i) {
      if (grammar_->byte_sets[pos_arg_[frames_[stacks[i]].pos]].Has(uint8_t(b))) {
        sig |= uint64_t{1} << i;
      }
    }
    return sig;
  };
  const uint64_t sig = signature(byte);
  std::vector<int32_t> out;
  bool accepting = false;
  work_.clear();
  for (size_t i = 0; i < stacks.size(); ++i) {
    const Frame f = frames_[stacks[i]];
    if (!grammar_->byte_sets[pos_arg_[f.pos]].Has(byte)) continue;
    work_.push_back(Intern(f.pos + 1, f.parent));
  }
  Expand(out, accepting);
  const int32_t n = status_.ok() ? InternState(std::move(out), accepting) : kDead;
  if (!status_.ok()) return n;
  if (row_[size_t(state)] < 0) {
    row_[size_t(state)] = int32_t(next_.size() / 256);
    next_.resize(next_.size() + 256, -1);
  }
  int32_t* row = &next_[size_t(row_[size_t(state)]) * 256];
  row[byte] = n;
  if (stacks.size() <= 64) {
    for (int b = 0; b < 256; ++b) {
      if (row[b] < 0 && signature(b) == sig) row[b] = n;
    }
  }
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

// Whether every whole non-ASCII character (valid UTF-8) leads from `state` back to it, through
// states that are not dead: then a subtree of valid UTF-8 whose ASCII bytes loop fits whole.
bool Automaton::Utf8LoopLocked(int32_t state) {
  if (states_[state].utf8_loop >= 0) return states_[state].utf8_loop == 1;
  // Depth-first over (grammar state, lead byte, continuation bytes seen), memoized on the first
  // two and the count: mid-character states are few.
  struct Item {
    int32_t g;
    uint8_t lead;
    int seen;
  };
  std::vector<Item> work;
  absl::flat_hash_map<uint64_t, bool> seen;
  bool ok = true;
  for (int lead = 0xC2; lead <= 0xF4 && ok; ++lead) {
    const int32_t g = StepLocked(state, uint8_t(lead));
    if (g == kDead) {
      ok = false;
      break;
    }
    work.push_back({g, uint8_t(lead), 0});
  }
  while (ok && !work.empty()) {
    const Item it = work.back();
    work.pop_back();
    const uint64_t key = (uint64_t(uint32_t(it.g)) << 16) | (uint64_t(it.lead) << 8) | uint64_t(it.seen);
    if (!seen.try_emplace(key, true).second) continue;
    const Utf8Step st = Utf8Next(it.lead, it.seen);
    for (int c = st.lo; c <= st.hi && ok; ++c) {
      const int32_t g = StepLocked(it.g, uint8_t(c));
      if (g == kDead) {
        ok = false;
      } else if (st.need == 1) {
        ok = g == state;  // a whole character: back where it started
      } else {
        work.push_back({g, it.lead, it.seen + 1});
      }
    }
    if (!status_.ok()) ok = false;
  }
  states_[state].utf8_loop = ok ? 1 : 0;
  return ok;
}

// Marks the tokens that fit from `state`: one pass over the trie in depth-first order, a
// subtree skipped at the first byte that does not fit, and taken whole when every byte under it
// loops on the state reached (inside a JSON string, most of the vocabulary).
void Automaton::Walk(int32_t state, std::vector<uint64_t>& words) {
  const TokenVocabulary& v = *vocab_;
  const uint8_t* byte = v.node_byte().data();
  const uint16_t* depth = v.node_depth().data();
  const int32_t* skip = v.node_skip().data();
  const int32_t* tok = v.node_tok().data();
  const int32_t* big = v.node_below().data();
  const int32_t* dfs = v.dfs_tokens().data();
  const auto mark = [&](int32_t from, int32_t to) {
    for (int32_t i = from; i < to; ++i) words[size_t(dfs[i]) >> 6] |= uint64_t{1} << (dfs[i] & 63);
  };
  static const ByteSet kAscii = ByteSet::Range(0, 0x7F);
  // Whether every token under big node k fits from s: its bytes loop on s, or its non-ASCII
  // part is valid UTF-8 and every character leads back to s.
  const auto Fits = [&](int32_t s, size_t k) {
    const ByteSet& under = v.below()[k];
    const ByteSet& loop = LoopLocked(s);
    if (loop.Contains(under)) return true;
    return v.below_utf8()[k] && loop.Contains(under & kAscii) && Utf8LoopLocked(s);
  };
  std::vector<int32_t> at(size_t(v.max_depth()) + 1);  // at[d]: the state after d bytes
  at[0] = state;
  const int32_t n = v.num_nodes();
  for (int32_t i = 0; i < n;) {
    const int32_t from = at[depth[i] - 1];
    const int32_t r = row_[size_t(from)];
    int32_t s = r >= 0 ? next_[size_t(r) * 256 + byte[i]] : -1;
    if (s < 0) s = StepLocked(from, byte[i]);
    if (s == kDead) {
      if (!status_.ok()) return;
      i = skip[i];
      continue;
    }
    if (big[i] >= 0 && Fits(s, size_t(big[i]))) {
      mark(tok[i], tok[skip[i]]);
      i = skip[i];
      continue;
    }
    mark(tok[i], tok[i + 1]);
    at[depth[i]] = s;
    ++i;
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
  if (!states_[state].stacks.empty()) Walk(state, mask);
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
