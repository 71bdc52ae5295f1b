// The llama2.c BPE tokenizer. Every rule here mirrors karpathy/llama2.c run.c so that our token ids
// (and therefore model outputs) match the reference implementation byte for byte; where run.c's
// behaviour is accidental (C-string truncation, sscanf leniency) we copy it on purpose.
#include "engine/tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <queue>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace heavykv {
namespace {

// Ids 3..258 are the byte-fallback tokens <0x00>..<0xFF>; a usable vocabulary has at least these.
constexpr int32_t kByteTokenOffset = 3;
constexpr int32_t kMinVocabSize = kByteTokenOffset + 256;

// run.c starts the best-merge search at -1e10, so a pair whose score is <= -1e10 never merges.
constexpr float kNoMergeScore = -1e10f;

// A little-endian cursor over the file contents that reports how far it got when it runs out.
class Reader {
 public:
  explicit Reader(const std::string& data) : data_(data) {}

  bool AtEnd() const { return pos_ == data_.size(); }
  size_t pos() const { return pos_; }

  template <typename T>
  bool Read(T* out) {
    if (data_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(out, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }

  bool ReadBytes(size_t n, std::string* out) {
    if (data_.size() - pos_ < n) return false;
    out->assign(data_.data() + pos_, n);
    pos_ += n;
    return true;
  }

 private:
  const std::string& data_;
  size_t pos_ = 0;
};

// run.c's isprint()/isspace() run in the default "C" locale; spelling them out keeps the answer
// independent of whatever locale the embedding program has set.
bool IsCPrint(unsigned char c) { return c >= 0x20 && c <= 0x7E; }
bool IsCSpace(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// Calls a caller's stop check once every kInterval polls, so polling per byte or per merge is
// cheap. An empty check never stops.
class StopPoller {
 public:
  explicit StopPoller(const std::function<bool()>& should_stop) : should_stop_(should_stop) {}

  bool Poll() {
    if (--countdown_ > 0 || !should_stop_) return false;
    countdown_ = kInterval;
    return should_stop_();
  }

 private:
  static constexpr int kInterval = 4096;
  const std::function<bool()>& should_stop_;
  int countdown_ = kInterval;
};

// run.c's greedy BPE, which rescans every adjacent pair per merge (quadratic), made O(n log n):
// the symbols form a doubly linked list over their original positions, and a priority queue holds
// one candidate per adjacent pair that has a merge, best score first, then leftmost. Each merge
// removes one symbol and queues at most two new pairs, so the queue holds O(n) entries.
//
// Why this picks the same pair as run.c every time: run.c merges the highest-scoring pair and, on a
// tie, the first in the sequence. A merged symbol keeps its left part's position, so surviving
// symbols keep their original order and "first in the sequence" is "smallest left position", the
// queue's tie-break. Entries of pairs that no longer exist are skipped when popped: a symbol's
// token changes only when it absorbs its right neighbour, which moves its `next` strictly right,
// so an entry is current exactly when its left symbol is alive, still links to its right symbol,
// and that right symbol still links to the same next one.
//
// `merge(a, b)` gives {merged id, its score} for tokens a, b, or {-1, _} when none exists.
template <typename Index, typename MergeFn>
bool MergePairs(const MergeFn& merge, StopPoller* stop, std::vector<int32_t>* tokens) {
  constexpr Index kNone = std::numeric_limits<Index>::max();
  constexpr int32_t kDead = -1;
  const Index n = static_cast<Index>(tokens->size());
  if (n < 2) return true;
  std::vector<int32_t>& tok = *tokens;  // [n]; kDead once merged into the left neighbour
  std::vector<Index> prev(n), next(n);  // [n] links of the surviving symbols
  for (Index i = 0; i < n; ++i) {
    prev[i] = i == 0 ? kNone : i - 1;
    next[i] = i + 1 == n ? kNone : i + 1;
  }

  struct Candidate {
    float score;
    int32_t id;        // the merged token
    Index left;        // its position, the tie-break
    Index right;       // == next[left] when queued
    Index right_next;  // == next[right] when queued
  };
  // std::priority_queue pops its greatest element: the best score, then the smallest position.
  auto worse = [](const Candidate& a, const Candidate& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(worse)> queue(worse);

  auto push = [&](Index left) {
    const Index right = next[left];
    const auto [id, score] = merge(tok[left], tok[right]);
    // run.c's search starts at kNoMergeScore with a strict '>', so such a pair (or a NaN score)
    // never merges; leaving it out also keeps the queue's ordering a strict weak one.
    if (id == -1 || !(score > kNoMergeScore)) return;
    queue.push(Candidate{score, id, left, right, next[right]});
  };
  for (Index i = 0; i + 1 < n; ++i) {
    if (stop->Poll()) return false;
    push(i);
  }

  while (!queue.empty()) {
    if (stop->Poll()) return false;
    const Candidate c = queue.top();
    queue.pop();
    if (tok[c.left] == kDead || next[c.left] != c.right || next[c.right] != c.right_next) continue;
    tok[c.left] = c.id;
    tok[c.right] = kDead;
    next[c.left] = c.right_next;
    if (c.right_next != kNone) prev[c.right_next] = c.left;
    if (prev[c.left] != kNone) push(prev[c.left]);
    if (c.right_next != kNone) push(c.left);
  }

  // The first symbol never merges into a left neighbour, so it heads the surviving list.
  Index out = 0;
  for (Index i = 0; i != kNone; i = next[i]) tok[out++] = tok[i];
  tok.resize(out);
  return true;
}

}  // namespace

absl::StatusOr<Tokenizer> Tokenizer::Load(const std::string& path, int32_t vocab_size) {
  if (vocab_size < kMinVocabSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer ", path, ": vocab_size ", vocab_size, " is below ", kMinVocabSize,
                     " (3 special tokens + 256 byte-fallback tokens)"));
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open tokenizer file ", path));
  std::string data((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (file.bad()) return absl::InvalidArgumentError(absl::StrCat("error reading tokenizer ", path));

  Reader reader(data);
  Tokenizer tok;
  if (!reader.Read(&tok.max_token_length_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer ", path, ": truncated: no max_token_length header"));
  }
  if (tok.max_token_length_ <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer ", path, ": invalid max_token_length ", tok.max_token_length_));
  }
  // The file does not store its vocabulary size, so read every token it holds: that tells a
  // truncated file (ends inside a token) apart from a wrong vocab_size (clean end, wrong count).
  // run.c itself would silently ignore extra tokens; we reject them as a model/tokenizer mismatch.
  while (!reader.AtEnd()) {
    const int32_t id = static_cast<int32_t>(tok.pieces_.size());
    float score;
    int32_t len;
    if (!reader.Read(&score) || !reader.Read(&len)) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer ", path,
                                                     ": truncated in the header of token ", id,
                                                     " at byte ", reader.pos()));
    }
    // run.c sizes its merge buffer from max_token_length; a longer piece would overflow it.
    if (len < 0 || len > tok.max_token_length_) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer ", path, ": token ", id, " has invalid length ", len,
                       " (max_token_length ", tok.max_token_length_, ")"));
    }
    std::string piece;
    if (!reader.ReadBytes(static_cast<size_t>(len), &piece)) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer ", path,
                                                     ": truncated in the bytes of token ", id,
                                                     " (needs ", len, " bytes)"));
    }
    // run.c handles pieces as C strings (strcmp, sprintf "%s"), so a NUL byte ends the piece.
    piece.resize(std::strlen(piece.c_str()));
    tok.pieces_.push_back(std::move(piece));
    tok.scores_.push_back(score);
    if (static_cast<int32_t>(tok.pieces_.size()) > vocab_size) break;
  }
  const int32_t found = static_cast<int32_t>(tok.pieces_.size());
  if (found != vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer ", path, ": vocabulary size mismatch: expected ", vocab_size,
                     " tokens, file has ", found > vocab_size ? "at least " : "", found));
  }
  // run.c finds pieces by bsearch over the vocabulary sorted with qsort, which on a duplicated
  // piece may return either id (tok512.bin has no duplicates). We pin the lowest id (emplace keeps
  // the first) so that the choice is at least deterministic.
  tok.ids_.reserve(tok.pieces_.size());
  for (int32_t id = 0; id < found; ++id) tok.ids_.emplace(tok.pieces_[id], id);
  return tok;
}

absl::StatusOr<Tokenizer> Tokenizer::FromPieces(
    std::vector<std::string> pieces, std::vector<float> scores, absl::string_view source,
    std::optional<SentencePieceOptions> sentencepiece) {
  if (pieces.size() != scores.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer ", source, ": ", pieces.size(),
                                                   " pieces but ", scores.size(), " scores"));
  }
  if (pieces.size() < size_t(kMinVocabSize) ||
      pieces.size() > size_t(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer ", source, ": ", pieces.size(), " pieces, need at least ",
                     kMinVocabSize, " (3 special tokens + 256 byte-fallback tokens)"));
  }
  Tokenizer tok;
  tok.max_token_length_ = 1;
  for (std::string& piece : pieces) {
    piece.resize(std::strlen(piece.c_str()));  // as Load: a NUL ends the piece
    tok.max_token_length_ = std::max(tok.max_token_length_, static_cast<int32_t>(piece.size()));
  }
  tok.pieces_ = std::move(pieces);
  tok.scores_ = std::move(scores);
  tok.ids_.reserve(tok.pieces_.size());
  for (int32_t id = 0; id < tok.vocab_size(); ++id) tok.ids_.emplace(tok.pieces_[id], id);
  if (!sentencepiece) return tok;

  SentencePieceOptions& o = *sentencepiece;
  const int64_t n = tok.vocab_size();
  auto invalid = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer ", source, ": ", parts...));
  };
  if (!o.types.empty() && o.types.size() != size_t(n)) {
    return invalid(n, " tokens but ", o.types.size(), " token types");
  }
  for (const auto& [what, id] :
       {std::pair<const char*, int32_t>{"BOS", o.bos_id}, {"EOS", o.eos_id}}) {
    if (id < -1 || id >= n) return invalid(what, " token id ", id, " is outside the vocabulary of ", n);
  }
  tok.run_c_ = false;
  tok.types_.assign(size_t(n), kNormal);
  for (size_t i = 0; i < o.types.size(); ++i) {
    const int32_t t = o.types[i];
    if (t < 0 || t > kByte) return invalid("token ", i, " has type ", t, " (GGUF types are 0..6)");
    if (t != 0) tok.types_[i] = t;
  }
  tok.bos_id_ = o.bos_id;
  tok.eos_id_ = o.eos_id;
  tok.add_bos_ = o.add_bos && o.bos_id >= 0;
  tok.add_eos_ = o.add_eos && o.eos_id >= 0;
  tok.add_space_prefix_ = o.add_space_prefix;
  for (int32_t id : o.eog_ids) {
    if (id < 0 || id >= n) return invalid("end-of-generation token id ", id, " is outside the vocabulary");
    tok.eog_ids_.push_back(id);
  }
  if (tok.eos_id_ >= 0) tok.eog_ids_.push_back(tok.eos_id_);
  std::vector<bool> rstrip(size_t(n), false);
  for (int32_t id : o.rstrip_ids) {
    if (id < 0 || id >= n) return invalid("rstrip token id ", id, " is outside the vocabulary");
    rstrip[id] = true;
  }
  for (int32_t id = 0; id < n; ++id) {
    const int32_t t = tok.types_[id];
    if (t == kControl || t == kUserDefined || t == kUnknown) {
      tok.specials_.Add(id, tok.pieces_[id], /*control=*/t != kUserDefined, rstrip[id]);
    }
    if (IsTurnEndText(tok.pieces_[id])) tok.eog_ids_.push_back(id);
  }
  tok.specials_.Finish();
  std::sort(tok.eog_ids_.begin(), tok.eog_ids_.end());
  tok.eog_ids_.erase(std::unique(tok.eog_ids_.begin(), tok.eog_ids_.end()), tok.eog_ids_.end());
  return tok;
}

bool Tokenizer::IsControl(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return false;
  // A tokenizer.bin has no types; run.c prints every piece it decodes.
  return !run_c_ && types_[id] == kControl;
}

bool Tokenizer::IsEndOfGeneration(int32_t id) const {
  // run.c stops at BOS (which separates its training stories) as well as EOS.
  if (run_c_) return id == bos_id_ || id == eos_id_;
  return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

class Tokenizer::Poller : public StopPoller {
 public:
  using StopPoller::StopPoller;
};

std::optional<std::vector<int32_t>> Tokenizer::Encode(std::string_view text, bool bos, bool eos,
                                                      const std::function<bool()>& should_stop,
                                                      bool parse_special) const {
  Poller stop(should_stop);
  std::vector<int32_t> tokens;
  tokens.reserve(text.size() + 3);
  if (run_c_) {
    // run.c receives a C string: anything after an embedded NUL is invisible to it.
    const size_t nul = text.find('\0');
    if (nul != std::string_view::npos) text = text.substr(0, nul);
    if (bos) tokens.push_back(bos_id_);
    // SentencePiece's add_dummy_prefix: the text is encoded as if it started with a space.
    // run.c merges over the whole list, BOS included.
    if (!AppendSymbols(text, /*dummy_prefix=*/!text.empty(), &stop, &tokens) ||
        !MergeSymbols(&stop, &tokens)) {
      return std::nullopt;
    }
  } else {
    if (bos && bos_id_ >= 0) tokens.push_back(bos_id_);
    // Special tokens first; each stretch of plain text is merged on its own, with the dummy
    // prefix when it starts the text or follows a special token (llama.cpp).
    std::vector<int32_t> part;
    bool after_special = true;
    size_t plain = 0;
    for (;;) {
      const SpecialTokenMatcher::Match m = specials_.Find(text, plain, parse_special);
      const size_t end = m.id < 0 ? text.size() : m.pos;
      if (end > plain) {
        part.clear();
        if (!AppendSymbols(text.substr(plain, end - plain), add_space_prefix_ && after_special,
                           &stop, &part) ||
            !MergeSymbols(&stop, &part)) {
          return std::nullopt;
        }
        tokens.insert(tokens.end(), part.begin(), part.end());
        after_special = false;
      }
      if (m.id < 0) break;
      tokens.push_back(m.id);
      after_special = true;
      plain = m.next;
    }
  }
  if (eos && eos_id_ >= 0) tokens.push_back(eos_id_);
  return tokens;
}

bool Tokenizer::AppendSymbols(std::string_view text, bool dummy_prefix, Poller* stop,
                              std::vector<int32_t>* tokens) const {
  if (dummy_prefix) {
    const int32_t space = Lookup(" ");
    // run.c would push -1 here (and crash later) if " " were missing; the byte token is the
    // closest well-defined choice. Every llama2.c tokenizer we know has a " " piece.
    tokens->push_back(space != -1 ? space : ' ' + kByteTokenOffset);
  }
  // Split into UTF-8 code points exactly as run.c does: a non-continuation byte starts a new code
  // point; continuation bytes (10xxxxxx) are appended up to 4 bytes. Stray continuation bytes
  // therefore group with each other, which is what run.c does too.
  std::string code_point;
  for (size_t i = 0; i < text.size(); ++i) {
    if (stop->Poll()) return false;
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c & 0xC0) != 0x80) code_point.clear();
    code_point.push_back(static_cast<char>(c));
    const bool next_is_continuation =
        i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80;
    if (next_is_continuation && code_point.size() < 4) continue;
    const int32_t id = Lookup(code_point);
    if (id != -1) {
      tokens->push_back(id);
    } else {
      // Byte fallback: the first 3 ids are <unk>, <s>, </s>, then one token per byte value.
      for (unsigned char b : code_point) {
        tokens->push_back(static_cast<int32_t>(b) + kByteTokenOffset);
      }
    }
    code_point.clear();
  }
  return true;
}

bool Tokenizer::MergeSymbols(Poller* stop, std::vector<int32_t>* tokens) const {
  // 32-bit symbol indices keep the merge queue small; only a text of 4 GiB needs 64-bit ones.
  std::string joined;
  auto merge = [this, &joined](int32_t left, int32_t right) -> std::pair<int32_t, float> {
    joined.assign(pieces_[left]);
    joined.append(pieces_[right]);
    const int32_t id = Lookup(joined);
    return {id, id == -1 ? 0.0f : scores_[id]};
  };
  return tokens->size() < std::numeric_limits<uint32_t>::max()
             ? MergePairs<uint32_t>(merge, stop, tokens)
             : MergePairs<uint64_t>(merge, stop, tokens);
}

int32_t Tokenizer::Lookup(const std::string& piece) const {
  auto it = ids_.find(piece);
  return it == ids_.end() ? -1 : it->second;
}

std::string Tokenizer::Decode(int32_t prev_token, int32_t token) const {
  // run.c would read out of bounds; an id the vocabulary lacks decodes to nothing instead.
  if (token < 0 || token >= vocab_size()) return std::string();
  std::string_view piece = pieces_[token];
  // SentencePiece strips the dummy-prefix space from the first piece after BOS.
  const bool strip_space = prev_token == bos_id_ && prev_token >= 0 && add_space_prefix_;
  if (!run_c_) {
    // The file says which tokens are bytes; every other piece is its text. The space is
    // stripped from the decoded bytes, as llama.cpp does, so a <0x20> byte token loses it too.
    std::string out(piece);
    if (types_[token] == kByte && piece.size() == 6 && piece.substr(0, 3) == "<0x" &&
        piece[5] == '>') {
      auto hex = [](char c) {
        return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
               : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      };
      const int hi = hex(piece[3]), lo = hex(piece[4]);
      if (hi >= 0 && lo >= 0) out.assign(1, static_cast<char>(hi * 16 + lo));
    }
    if (strip_space && !out.empty() && out.front() == ' ') out.erase(0, 1);
    return out;
  }
  // run.c strips it from the piece's text, so a byte token keeps its byte.
  if (strip_space && !piece.empty() && piece.front() == ' ') piece.remove_prefix(1);
  // Use sscanf itself rather than a stricter parser: run.c accepts whatever this format accepts
  // (note it never checks the closing '>'), and we want the same bytes out.
  const std::string piece_str(piece);
  unsigned char byte_val = 0;
  if (std::sscanf(piece_str.c_str(), "<0x%02hhX>", &byte_val) == 1) {
    // run.c returns a one-byte C string, so byte 0x00 decodes to the empty string.
    if (byte_val == 0) return std::string();
    return std::string(1, static_cast<char>(byte_val));
  }
  return piece_str;
}

bool Tokenizer::IsPrintablePiece(std::string_view piece) {
  // Raw byte tokens can be control bytes or fragments of a UTF-8 sequence; run.c drops a lone
  // byte that is neither printable nor whitespace rather than emit garbage to the terminal.
  if (piece.size() != 1) return true;
  const auto b = static_cast<unsigned char>(piece[0]);
  return IsCPrint(b) || IsCSpace(b);
}

}  // namespace heavykv
