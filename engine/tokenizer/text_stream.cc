#include "engine/tokenizer/text_stream.h"

#include <algorithm>

#include "engine/tokenizer/tokenizer.h"

namespace heavykv {
namespace {

// Length of the UTF-8 sequence that `lead` starts, or 0 if it cannot start one.
int SequenceLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Whether the first `have` bytes of the `len`-byte sequence at s[i] can begin a valid character
// (continuation bytes, and the second-byte ranges that rule out overlongs, surrogates and
// code points above U+10FFFF).
bool ValidPrefixAt(absl::string_view s, size_t i, int len, int have) {
  for (int j = 1; j < have; ++j) {
    if ((static_cast<unsigned char>(s[i + j]) & 0xC0) != 0x80) return false;
  }
  if (len >= 3 && have >= 2) {
    const unsigned char b0 = s[i], b1 = s[i + 1];
    if (b0 == 0xE0 && b1 < 0xA0) return false;
    if (b0 == 0xED && b1 > 0x9F) return false;
    if (b0 == 0xF0 && b1 < 0x90) return false;
    if (b0 == 0xF4 && b1 > 0x8F) return false;
  }
  return true;
}

}  // namespace

TextStream::TextStream(const TextTokenizer* tokenizer, int32_t prev_token,
                       std::vector<std::string> stops, bool skip_special)
    : tokenizer_(tokenizer),
      prev_(prev_token),
      stops_(std::move(stops)),
      skip_special_(skip_special) {
  for (const std::string& s : stops_) hold_ = std::max(hold_, s.empty() ? 0 : s.size() - 1);
}

size_t TextStream::WholeCharLength(absl::string_view s) {
  if (s.empty()) return 0;
  const int len = SequenceLength(static_cast<unsigned char>(s[0]));
  if (len == 0 || s.size() < size_t(len) || !ValidPrefixAt(s, 0, len, len)) return 0;
  return size_t(len);
}

size_t TextStream::CompletePrefix(absl::string_view s) {
  // Only the last 3 bytes can be an unfinished character: find its lead byte.
  for (size_t back = 1; back <= std::min<size_t>(3, s.size()); ++back) {
    const size_t i = s.size() - back;
    const unsigned char c = s[i];
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: the lead is further back
    const int len = SequenceLength(c);
    const int have = static_cast<int>(back);
    if (len > have && ValidPrefixAt(s, i, len, have)) return i;  // may still complete
    return s.size();
  }
  return s.size();
}

std::string TextStream::Sanitize(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (const size_t whole = WholeCharLength(s.substr(i)); whole > 0) {
      out.append(s.data() + i, whole);
      i += whole;
    } else {
      const int len = SequenceLength(static_cast<unsigned char>(s[i]));
      // One U+FFFD per maximal subpart (Unicode ch. 3, "U+FFFD Substitution of Maximal
      // Subparts", as Python and browsers decode): the longest start of a valid sequence, or
      // else one byte.
      size_t take = 1;
      for (int have = len - 1; have > 1; --have) {
        if (i + have <= s.size() && ValidPrefixAt(s, i, len, have)) {
          take = have;
          break;
        }
      }
      out += "\xEF\xBF\xBD";
      i += take;
    }
  }
  return out;
}

std::string TextStream::Push(int32_t token, bool* stopped) {
  *stopped = false;
  if (tokenizer_ == nullptr) return "";
  std::string piece = tokenizer_->Decode(prev_, token);
  prev_ = token;
  const bool shown = !(skip_special_ && tokenizer_->IsControl(token)) &&
                     (!tokenizer_->run_c_text_rules() || Tokenizer::IsPrintablePiece(piece));
  if (shown) pending_ += piece;
  // The match that starts earliest wins, whatever the order of the list.
  size_t at = std::string::npos;
  for (const std::string& stop : stops_) {
    if (!stop.empty()) at = std::min(at, pending_.find(stop));
  }
  if (at != std::string::npos) {
    *stopped = true;
    std::string out = Sanitize(absl::string_view(pending_).substr(0, at));
    pending_.clear();
    return out;
  }
  if (pending_.size() <= hold_) return "";
  size_t cut = CompletePrefix(absl::string_view(pending_).substr(0, pending_.size() - hold_));
  std::string out = Sanitize(absl::string_view(pending_).substr(0, cut));
  pending_.erase(0, cut);
  return out;
}

std::string TextStream::Flush() {
  std::string out = Sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace heavykv
