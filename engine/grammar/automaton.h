// Automaton: matches bytes against a Grammar (grammar.h) and computes token masks over a model's
// vocabulary (docs/ARCHITECTURE.md "Structured outputs").
//
//   auto vocab = TokenVocabulary::FromTokenizer(*tokenizer);          // once per model
//   auto a = std::make_shared<Automaton>(grammar, vocab);             // once per compiled grammar
//   int32_t s = a->Start();
//   a->FillMask(s, words);          // [ceil(vocab/64)] bit t: token t may come next
//   s = a->StepToken(s, token);     // kDead: the token does not fit
//
// A state is a set of parser stacks (a nondeterministic pushdown automaton over bytes; a call in
// tail position replaces its caller's frame, so loops do not grow the stack). Stacks and states
// are interned, so the same situation is the same state id, and each state's byte transitions
// and its token mask are computed once and kept: inside a JSON string every character leads back
// to the same state, whose mask is then a lookup. A mask walks the vocabulary's byte trie from
// the state, pruning at the first byte that does not fit; a subtree whose bytes all loop on the
// state is accepted whole without walking it.
//
// Thread safety: every method locks the automaton (it is shared by all the sequences of one
// compiled grammar). States stay valid for the automaton's life. Past AutomatonLimits a step
// returns kDead and status() says why (RESOURCE_EXHAUSTED).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "engine/grammar/grammar.h"
#include "engine/tokenizer/text_tokenizer.h"

namespace heavykv::grammar {

// Whether `bytes` is valid UTF-8 from a character boundary, its last character possibly cut
// short (no overlong forms, surrogates or code points past U+10FFFF).
bool ValidUtf8Prefix(std::string_view bytes);

// The bytes of every token as generation writes them, and a trie over them. Control tokens
// (and tokens with no bytes) are never matched as text; the end-of-generation tokens are
// allowed exactly where the grammar may end.
class TokenVocabulary {
 public:
  static std::shared_ptr<const TokenVocabulary> FromTokenizer(const TextTokenizer& tokenizer);
  // For tests: token i has bytes[i]; `eog` end a generation; `control` are never allowed.
  static std::shared_ptr<const TokenVocabulary> FromBytes(std::vector<std::string> bytes,
                                                          std::vector<int32_t> eog,
                                                          std::vector<int32_t> control = {});

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  int32_t num_words() const { return (size() + 63) / 64; }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }
  bool IsEog(int32_t id) const { return kind_[id] == kEog; }
  bool IsText(int32_t id) const { return kind_[id] == kText; }
  const std::vector<int32_t>& eog_ids() const { return eog_; }
  // Identifies the vocabulary in cache keys (a hash of every token's bytes and kind).
  uint64_t fingerprint() const { return fingerprint_; }

  // The trie, flattened in depth-first order (the root, the empty prefix, is left out): node i
  // adds byte `node_byte[i]` at depth `node_depth[i]` (1 for the root's children) to its parent's
  // bytes; node_skip[i] is the next node outside its subtree. Its own tokens (whose bytes end
  // there) are dfs_tokens[node_tok[i], node_tok[i + 1]), its subtree's [node_tok[i],
  // node_tok[node_skip[i]]). Nodes with more than 16 tokens below have node_below[i] >= 0: the
  // index in `below` of the set of bytes on the edges under them.
  int32_t num_nodes() const { return static_cast<int32_t>(node_byte_.size()); }
  int32_t max_depth() const { return max_depth_; }
  const std::vector<uint8_t>& node_byte() const { return node_byte_; }
  const std::vector<uint16_t>& node_depth() const { return node_depth_; }
  const std::vector<int32_t>& node_skip() const { return node_skip_; }
  const std::vector<int32_t>& node_tok() const { return node_tok_; }  // [num_nodes + 1]
  const std::vector<int32_t>& node_below() const { return node_below_; }
  const std::vector<ByteSet>& below() const { return below_; }
  // below_utf8[k]: every token under the big node of below()[k], read from that node on, is
  // valid UTF-8 (a last character may be cut short): such a subtree can be taken whole by a
  // state that every whole character leads back to.
  const std::vector<bool>& below_utf8() const { return below_utf8_; }
  const std::vector<int32_t>& dfs_tokens() const { return dfs_tokens_; }
  // The longest text token that `text` starts with, by the trie: {id, its length in bytes};
  // {-1, 0} when none does.
  std::pair<int32_t, size_t> LongestPrefixToken(std::string_view text) const;

 private:
  enum Kind : uint8_t { kText, kEog, kNever };
  void Build();

  std::vector<std::string> bytes_;
  std::vector<Kind> kind_;
  std::vector<int32_t> eog_;
  uint64_t fingerprint_ = 0;
  std::vector<uint8_t> node_byte_;
  std::vector<uint16_t> node_depth_;
  std::vector<int32_t> node_skip_, node_tok_, node_below_;
  std::vector<ByteSet> below_;
  std::vector<bool> below_utf8_;
  std::vector<int32_t> dfs_tokens_;
  int32_t max_depth_ = 0;
};

// What one automaton may hold (it lives as long as its compiled constraint is cached): with the
// compile cache's 32 entries, at most about 32 x (24 + 8 + 120) MiB however hostile the grammars.
struct AutomatonLimits {
  int32_t max_stacks_per_state = 2048;  // an ambiguity past this ends the match
  // Interned states (about 100 bytes each, 1 KiB more once stepped from): a large object's
  // grammar meets tens of thousands over a few instances.
  int32_t max_states = 200'000;
  int64_t max_frames = 1'000'000;       // interned stack frames (about 24 bytes each)
  int64_t max_mask_cache_bytes = 8 << 20;  // cached masks (V/8 bytes each); full: dropped
};

class Automaton {
 public:
  static constexpr int32_t kDead = 0;

  Automaton(std::shared_ptr<const Grammar> grammar,
            std::shared_ptr<const TokenVocabulary> vocab = nullptr, AutomatonLimits limits = {});

  const Grammar& grammar() const { return *grammar_; }
  const TokenVocabulary* vocab() const { return vocab_.get(); }

  int32_t Start();
  int32_t Step(int32_t state, uint8_t byte);
  int32_t StepBytes(int32_t state, std::string_view bytes);
  // The state after a text token's bytes; kDead for a token the grammar refuses here (an
  // end-of-generation token is refused too: the caller checks Accepting first).
  int32_t StepToken(int32_t state, int32_t token);
  bool Accepting(int32_t state);
  // Whether any more bytes may follow (false: only the end may come).
  bool CanContinue(int32_t state);
  // Sets words [vocab->num_words()] to the tokens allowed next: text tokens whose bytes fit and
  // the end-of-generation tokens where the grammar may end.
  void FillMask(int32_t state, std::span<uint64_t> words);
  absl::Status status();

  // For benchmarks and tests.
  int64_t num_states();
  int64_t num_frames();

 private:
  struct Frame {
    int32_t pos;     // the element to match next in its alternative (flattened position)
    int32_t parent;  // the rest of the stack (0: the bottom)
  };
  struct State {
    std::vector<int32_t> stacks;  // sorted; each stack's top is at a byte-set element
    bool accepting = false;
    std::unique_ptr<ByteSet> loop;  // ASCII bytes that lead back to this state
    int8_t utf8_loop = -1;          // every non-ASCII character leads back (-1: not known yet)
    std::shared_ptr<const std::vector<uint64_t>> mask;
  };

  int32_t Intern(int32_t pos, int32_t parent);
  // Closes work_ (stacks to expand; emptied) into `out`.
  void Expand(std::vector<int32_t>& out, bool& accepting);
  int32_t InternState(std::vector<int32_t> stacks, bool accepting);
  int32_t StepLocked(int32_t state, uint8_t byte);
  const ByteSet& LoopLocked(int32_t state);
  bool Utf8LoopLocked(int32_t state);
  void Walk(int32_t state, std::vector<uint64_t>& words);
  void Fail(absl::Status s);

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  AutomatonLimits limits_;

  // Flattened positions: pos_kind_[p] 0 byte set, 1 rule, 2 end of alternative.
  std::vector<uint8_t> pos_kind_;
  std::vector<int32_t> pos_arg_;
  std::vector<std::vector<int32_t>> rule_starts_;  // [rule] first position of each alternative

  std::mutex mu_;
  std::vector<Frame> frames_;
  absl::flat_hash_map<uint64_t, int32_t> frame_ids_;
  std::vector<State> states_;
  // Byte transitions, a row of 256 per state stepped from (row_[state]; -1: none yet), -1 where
  // not computed yet. Many states (a trie walk's leaves) are never stepped from.
  std::vector<int32_t> row_;
  std::vector<int32_t> next_;
  absl::flat_hash_map<std::string, int32_t> state_ids_;  // key: accepting + stack ids
  int32_t start_ = -1;
  int64_t mask_bytes_ = 0;
  absl::Status status_;
  // Expand's scratch: the stacks to close, and per frame the last closure that met it.
  std::vector<int32_t> work_;
  std::vector<uint32_t> seen_;
  uint32_t closure_ = 0;
};

}  // namespace heavykv::grammar
