#include "engine/tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace heavykv {
namespace {

// GPT-2's byte-to-unicode alphabet: the printable Latin-1 bytes stand for themselves; the other
// 68 (controls, space, DEL, NBSP, soft hyphen) take U+0100, U+0101, ... in byte order, so that
// every byte is one visible code point.
struct ByteAlphabet {
  uint32_t code_point[256];
  int32_t byte_of[512];  // code point -> byte, or -1 (every alphabet code point is below 0x144)

  ByteAlphabet() {
    std::fill(std::begin(byte_of), std::end(byte_of), -1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      code_point[b] = printable ? uint32_t(b) : next++;
      byte_of[code_point[b]] = b;
    }
  }
};

const ByteAlphabet& Alphabet() {
  static const ByteAlphabet* alphabet = new ByteAlphabet();
  return *alphabet;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(char(cp));
  } else if (cp < 0x800) {
    out->push_back(char(0xC0 | (cp >> 6)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(char(0xE0 | (cp >> 12)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  }
}

// The bytes a byte-level piece stands for. A code point outside the alphabet (not written by a
// byte-level converter) and any invalid UTF-8 are kept as they are.
std::string DecodeByteLevel(std::string_view piece) {
  std::string out;
  out.reserve(piece.size());
  size_t i = 0;
  while (i < piece.size()) {
    const auto c = static_cast<unsigned char>(piece[i]);
    uint32_t cp = std::numeric_limits<uint32_t>::max();
    size_t len = 1;
    if (c < 0x80) {
      cp = c;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < piece.size() && (piece[i + 1] & 0xC0) == 0x80) {
      cp = (uint32_t(c & 0x1F) << 6) | (piece[i + 1] & 0x3F);
      len = 2;
    }
    const int32_t byte = cp < 512 ? Alphabet().byte_of[cp] : -1;
    if (byte >= 0) {
      out.push_back(char(byte));
    } else {
      out.append(piece.substr(i, len));
    }
    i += len;
  }
  return out;
}

absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

// Scratch space for one Encode call: the output, the pre-token spans and the merge state, reused
// across pre-tokens so a long text allocates a few times, not per word.
class BpeTokenizer::Workspace {
 public:
  explicit Workspace(const std::function<bool()>& should_stop) : should_stop_(should_stop) {}

  // True when the caller's stop check says stop; it runs once every kInterval calls.
  bool Stopped(int cost = 1) {
    countdown_ -= cost;
    if (countdown_ > 0 || !should_stop_) return false;
    countdown_ = kInterval;
    return should_stop_();
  }

  struct Candidate {
    int32_t rank;
    uint32_t left;   // position of the left symbol, the tie-break
    uint32_t right;  // position of the right symbol when queued
    int32_t left_id, right_id, merged_id;
  };

  std::vector<int32_t> out;
  std::vector<PreTokenizer::Span> spans;
  std::vector<int32_t> symbols;      // [word bytes] token per surviving symbol, kDead otherwise
  std::vector<uint32_t> prev, next;  // [word bytes] links between surviving symbols
  std::vector<Candidate> heap;
  // Pre-tokens already merged in this call -> {first id's index in `out`, number of ids}: text
  // repeats its words, and a lookup is cheaper than merging again. Views into the text.
  absl::flat_hash_map<absl::string_view, std::pair<uint32_t, uint32_t>> seen;

 private:
  static constexpr int kInterval = 4096;
  const std::function<bool()>& should_stop_;
  int countdown_ = kInterval;
};

absl::StatusOr<BpeTokenizer> BpeTokenizer::Create(Vocab vocab, absl::string_view source) {
  auto invalid = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("BPE tokenizer ", source, ": ", parts...));
  };
  const size_t n = vocab.tokens.size();
  if (n == 0 || n > size_t(std::numeric_limits<int32_t>::max())) {
    return invalid("vocabulary of ", n, " tokens");
  }
  if (!vocab.types.empty() && vocab.types.size() != n) {
    return invalid(n, " tokens but ", vocab.types.size(), " token types");
  }
  for (const auto& [what, id] : {std::pair<const char*, int32_t>{"BOS", vocab.bos_id},
                                 {"EOS", vocab.eos_id},
                                 {"unknown", vocab.unknown_id}}) {
    if (id < -1 || id >= int64_t(n)) {
      return invalid(what, " token id ", id, " is outside the vocabulary of ", n);
    }
  }
  absl::StatusOr<PreTokenizer> pre = PreTokenizer::Create(vocab.pre);
  if (!pre.ok()) return invalid(pre.status().message());

  BpeTokenizer tok(*std::move(pre));
  tok.pieces_ = std::move(vocab.tokens);
  tok.types_.assign(n, kNormal);
  for (size_t i = 0; i < vocab.types.size(); ++i) {
    const int32_t t = vocab.types[i];
    if (t < 0 || t > kByte) return invalid("token ", i, " has type ", t, " (GGUF types are 1..6)");
    tok.types_[i] = t == 0 ? kNormal : TokenType(t);
  }
  tok.bos_id_ = vocab.bos_id;
  tok.eos_id_ = vocab.eos_id;
  tok.unknown_id_ = vocab.unknown_id;
  tok.add_bos_ = vocab.add_bos.value_or(tok.pre_.default_add_bos());
  tok.add_eos_ = vocab.add_eos;
  for (int32_t id : vocab.eog_ids) {
    if (id < 0 || id >= int64_t(n))
      return invalid("end-of-generation token id ", id, " is outside the vocabulary of ", n);
    tok.eog_ids_.push_back(id);
  }
  if (tok.eos_id_ >= 0) tok.eog_ids_.push_back(tok.eos_id_);
  std::vector<bool> rstrip(n, false);
  for (int32_t id : vocab.rstrip_ids) {
    if (id < 0 || id >= int64_t(n)) {
      return invalid("rstrip token id ", id, " is outside the vocabulary of ", n);
    }
    rstrip[id] = true;
  }

  // Lookups by piece, for merges and the byte tokens; the first id wins on duplicates.
  absl::flat_hash_map<absl::string_view, int32_t> by_piece;
  by_piece.reserve(n);
  tok.ids_by_bytes_.reserve(n);
  tok.bytes_.resize(n);
  for (int32_t id = 0; id < int32_t(n); ++id) {
    const std::string& piece = tok.pieces_[id];
    by_piece.emplace(piece, id);
    // llama.cpp's special tokens: control, user-defined and unknown ones.
    const bool special = tok.types_[id] == kControl || tok.types_[id] == kUserDefined ||
                         tok.types_[id] == kUnknown;
    if (special) {
      tok.bytes_[id] = piece;
      tok.specials_.Add(id, piece, /*control=*/tok.types_[id] != kUserDefined, rstrip[id]);
    } else {
      tok.bytes_[id] = DecodeByteLevel(piece);
      tok.ids_by_bytes_.emplace(tok.bytes_[id], id);
    }
  }
  for (int32_t id = 0; id < int32_t(n); ++id) {
    if (IsTurnEndText(tok.pieces_[id])) tok.eog_ids_.push_back(id);
  }
  std::sort(tok.eog_ids_.begin(), tok.eog_ids_.end());
  tok.eog_ids_.erase(std::unique(tok.eog_ids_.begin(), tok.eog_ids_.end()), tok.eog_ids_.end());
  tok.specials_.Finish();
  for (int b = 0; b < 256; ++b) {
    std::string piece;
    AppendUtf8(Alphabet().code_point[b], &piece);
    auto it = by_piece.find(piece);
    tok.byte_ids_[b] = it == by_piece.end() ? -1 : it->second;
  }

  tok.merges_.reserve(vocab.merges.size());
  std::string joined;
  for (size_t rank = 0; rank < vocab.merges.size(); ++rank) {
    const std::string& merge = vocab.merges[rank];
    const size_t space = merge.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == merge.size() ||
        merge.find(' ', space + 1) != std::string::npos) {
      return invalid("merge ", rank, " '", merge, "' is not two tokens separated by a space");
    }
    const absl::string_view left = absl::string_view(merge).substr(0, space);
    const absl::string_view right = absl::string_view(merge).substr(space + 1);
    joined.assign(left.data(), left.size());
    joined.append(right.data(), right.size());
    int32_t ids[3];
    const absl::string_view parts[3] = {left, right, joined};
    for (int k = 0; k < 3; ++k) {
      auto it = by_piece.find(parts[k]);
      if (it == by_piece.end()) {
        return invalid("merge ", rank, " '", merge, "' needs token '", parts[k],
                       "', which is not in the vocabulary");
      }
      ids[k] = it->second;
    }
    if (rank > size_t(std::numeric_limits<int32_t>::max())) return invalid("too many merges");
    tok.merges_.emplace(PairKey(ids[0], ids[1]), Merge{int32_t(rank), ids[2]});
  }
  return tok;
}

std::optional<std::vector<int32_t>> BpeTokenizer::Encode(std::string_view text, bool bos, bool eos,
                                                         const std::function<bool()>& should_stop,
                                                         bool parse_special) const {
  Workspace ws(should_stop);
  ws.out.reserve(text.size() / 3 + 2);
  if (bos && bos_id_ >= 0) ws.out.push_back(bos_id_);
  // Special tokens first: the plain text between them is pre-tokenized on its own.
  size_t plain = 0;
  for (;;) {
    const SpecialTokenMatcher::Match m = specials_.Find(text, plain, parse_special);
    if (m.id < 0) break;
    if (!EncodeText(text.substr(plain, m.pos - plain), &ws)) return std::nullopt;
    ws.out.push_back(m.id);
    plain = m.next;
  }
  if (!EncodeText(text.substr(plain), &ws)) return std::nullopt;
  if (eos && eos_id_ >= 0) ws.out.push_back(eos_id_);
  return std::move(ws.out);
}

bool BpeTokenizer::EncodeText(std::string_view text, Workspace* ws) const {
  if (text.empty()) return true;
  ws->spans.clear();
  pre_.Split(text, &ws->spans);
  if (ws->Stopped(int(std::min<size_t>(text.size() / 64, 1 << 20)))) return false;
  // Words up to this many bytes are remembered (longer ones rarely repeat).
  constexpr size_t kMaxCachedWord = 64;
  for (const PreTokenizer::Span& span : ws->spans) {
    const std::string_view word = text.substr(span.begin, span.end - span.begin);
    if (ws->Stopped()) return false;
    if (word.size() < 2 || word.size() > kMaxCachedWord ||
        ws->out.size() >= std::numeric_limits<uint32_t>::max() / 2) {
      if (!EncodeWord(word, ws)) return false;
      continue;
    }
    const auto [it, inserted] = ws->seen.try_emplace(AbslView(word), uint32_t(ws->out.size()), 0);
    if (!inserted) {
      const auto [first, count] = it->second;
      for (uint32_t k = 0; k < count; ++k) ws->out.push_back(ws->out[first + k]);
      continue;
    }
    if (!EncodeWord(word, ws)) return false;
    it->second.second = uint32_t(ws->out.size() - it->second.first);
  }
  return true;
}

bool BpeTokenizer::EncodeWord(std::string_view word, Workspace* ws) const {
  auto emit_byte = [&](unsigned char b) {
    const int32_t id = byte_ids_[b];
    if (id >= 0) {
      ws->out.push_back(id);
    } else if (unknown_id_ >= 0) {
      ws->out.push_back(unknown_id_);
    }
  };
  if (word.size() == 1) {
    emit_byte(static_cast<unsigned char>(word[0]));
    return true;
  }
  if (pre_.ignore_merges()) {
    auto it = ids_by_bytes_.find(AbslView(word));
    if (it != ids_by_bytes_.end()) {
      ws->out.push_back(it->second);
      return true;
    }
  }
  // Pre-tokens longer than 4 GiB - 1 are merged in parts (no real text has one).
  constexpr size_t kMaxWord = std::numeric_limits<uint32_t>::max() - 1;
  if (word.size() > kMaxWord) {
    return EncodeWord(word.substr(0, kMaxWord), ws) && EncodeWord(word.substr(kMaxWord), ws);
  }

  using Candidate = Workspace::Candidate;
  constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
  constexpr int32_t kDead = -2;  // merged into its left neighbour (-1: a byte with no token)
  const auto n = uint32_t(word.size());
  std::vector<int32_t>& sym = ws->symbols;
  std::vector<uint32_t>& prev = ws->prev;
  std::vector<uint32_t>& next = ws->next;
  std::vector<Candidate>& heap = ws->heap;
  sym.resize(n);
  prev.resize(n);
  next.resize(n);
  heap.clear();
  for (uint32_t i = 0; i < n; ++i) {
    sym[i] = byte_ids_[static_cast<unsigned char>(word[i])];
    prev[i] = i == 0 ? kNone : i - 1;
    next[i] = i + 1 == n ? kNone : i + 1;
  }
  // The heap's top is the best candidate: the lowest rank, then the leftmost.
  auto worse = [](const Candidate& a, const Candidate& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  };
  auto push = [&](uint32_t left) {
    const uint32_t right = next[left];
    if (sym[left] < 0 || sym[right] < 0) return;
    auto it = merges_.find(PairKey(sym[left], sym[right]));
    if (it == merges_.end()) return;
    heap.push_back(Candidate{it->second.rank, left, right, sym[left], sym[right], it->second.id});
    std::push_heap(heap.begin(), heap.end(), worse);
  };
  for (uint32_t i = 0; i + 1 < n; ++i) push(i);
  if (ws->Stopped(int(n))) return false;

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), worse);
    const Candidate c = heap.back();
    heap.pop_back();
    // A candidate is stale once either symbol changed: a symbol's token fixes its length, so the
    // same token at the same position with the same right neighbour is the same pair.
    if (sym[c.left] != c.left_id || next[c.left] != c.right || sym[c.right] != c.right_id) {
      continue;
    }
    if (ws->Stopped()) return false;
    sym[c.left] = c.merged_id;
    sym[c.right] = kDead;
    next[c.left] = next[c.right];
    if (next[c.left] != kNone) prev[next[c.left]] = c.left;
    if (prev[c.left] != kNone) push(prev[c.left]);
    if (next[c.left] != kNone) push(c.left);
  }
  for (uint32_t i = 0; i != kNone; i = next[i]) {
    if (sym[i] >= 0) {
      ws->out.push_back(sym[i]);
    } else {
      emit_byte(static_cast<unsigned char>(word[i]));  // a byte with no token: unknown or nothing
    }
  }
  return true;
}

std::string BpeTokenizer::Describe() const {
  return absl::StrCat("byte-level BPE (", pre_.name(), ")");
}

bool BpeTokenizer::IsEndOfGeneration(int32_t id) const {
  return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

const std::string& BpeTokenizer::Decode(int32_t token) const {
  static const std::string* empty = new std::string();
  if (token < 0 || token >= vocab_size()) return *empty;
  return bytes_[token];
}

}  // namespace heavykv
