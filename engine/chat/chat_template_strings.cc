// Python's str methods (engine/chat/chat_template_strings.h).
#include "engine/chat/chat_template_strings.h"

#include <algorithm>

#include "engine/chat/chat_template_value.h"

namespace heavykv::jinja {
namespace {

bool IsAsciiLetter(uint32_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
uint32_t Up(uint32_t c) { return c >= 'a' && c <= 'z' ? c - 32 : c; }
uint32_t Low(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

// A cased character for str.title(): letters, approximated as ASCII letters and any non-ASCII
// code point that is not whitespace or common punctuation.
bool IsCased(uint32_t c) {
  if (c < 0x80) return IsAsciiLetter(c);
  return !IsPySpace(c) && !(c >= 0x2000 && c <= 0x206F) && !(c >= 0x3000 && c <= 0x303F);
}

}  // namespace

std::string PyStrip(const std::string& s, const std::string* chars, bool left, bool right) {
  std::vector<uint32_t> cps = DecodeUtf8(s);
  std::vector<uint32_t> set;
  if (chars) set = DecodeUtf8(*chars);
  auto strip = [&](uint32_t c) {
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : IsPySpace(c);
  };
  size_t begin = 0;
  size_t end = cps.size();
  if (left) {
    while (begin < end && strip(cps[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strip(cps[end - 1])) --end;
  }
  return EncodeUtf8(cps, begin, end);
}

std::vector<std::string> PySplit(const std::string& s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t at = s.find(*sep, pos);
      if (at == std::string::npos) break;
      out.push_back(s.substr(pos, at - pos));
      pos = at + sep->size();
    }
    out.push_back(s.substr(pos));
    return out;
  }
  std::vector<uint32_t> cps = DecodeUtf8(s);
  size_t k = 0;
  while (true) {
    while (k < cps.size() && IsPySpace(cps[k])) ++k;
    if (k == cps.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      size_t end = cps.size();
      while (end > k && IsPySpace(cps[end - 1])) --end;
      out.push_back(EncodeUtf8(cps, k, end));
      break;
    }
    size_t start = k;
    while (k < cps.size() && !IsPySpace(cps[k])) ++k;
    out.push_back(EncodeUtf8(cps, start, k));
  }
  return out;
}

std::string PyReplace(const std::string& s, const std::string& from, const std::string& to,
                      int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` before every code point and at the end.
    std::vector<uint32_t> cps = DecodeUtf8(s);
    int64_t done = 0;
    for (uint32_t c : cps) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      AppendUtf8(c, &out);
    }
    if (count < 0 || done < count) out += to;
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(from, pos);
    if (at == std::string::npos) break;
    out.append(s, pos, at - pos);
    out += to;
    pos = at + from.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

std::string PyUpper(std::string s) {
  for (char& c : s) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
  }
  return s;
}

std::string PyLower(std::string s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
  }
  return s;
}

std::string PyCapitalize(const std::string& s) {
  std::vector<uint32_t> cps = DecodeUtf8(s);
  for (size_t k = 0; k < cps.size(); ++k) cps[k] = k == 0 ? Up(cps[k]) : Low(cps[k]);
  return EncodeUtf8(cps, 0, cps.size());
}

std::string PyTitle(const std::string& s) {
  std::vector<uint32_t> cps = DecodeUtf8(s);
  bool prev_cased = false;
  for (uint32_t& c : cps) {
    c = prev_cased ? Low(c) : Up(c);
    prev_cased = IsCased(c);
  }
  return EncodeUtf8(cps, 0, cps.size());
}

std::string JinjaTitle(const std::string& s) {
  std::vector<uint32_t> cps = DecodeUtf8(s);
  auto is_sep = [](uint32_t c) {
    return IsPySpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
  };
  // Pieces alternate between words and separator runs; each piece's first code point is
  // upper-cased and the rest lower-cased.
  size_t k = 0;
  while (k < cps.size()) {
    const bool sep = is_sep(cps[k]);
    size_t end = k;
    while (end < cps.size() && is_sep(cps[end]) == sep) ++end;
    for (size_t j = k; j < end; ++j) cps[j] = j == k ? Up(cps[j]) : Low(cps[j]);
    k = end;
  }
  return EncodeUtf8(cps, 0, cps.size());
}

std::vector<std::string> PySplitLines(const std::string& s) {
  std::vector<uint32_t> cps = DecodeUtf8(s);
  std::vector<std::string> out;
  size_t start = 0;
  size_t k = 0;
  while (k < cps.size()) {
    const uint32_t c = cps[k];
    const bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
                     c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) {
      ++k;
      continue;
    }
    out.push_back(EncodeUtf8(cps, start, k));
    k += (c == '\r' && k + 1 < cps.size() && cps[k + 1] == '\n') ? 2 : 1;
    start = k;
  }
  if (start < cps.size()) out.push_back(EncodeUtf8(cps, start, cps.size()));
  return out;
}

int64_t PyFind(const std::string& s, const std::string& sub) {
  const size_t at = s.find(sub);
  if (at == std::string::npos) return -1;
  return static_cast<int64_t>(DecodeUtf8(s.substr(0, at)).size());
}

}  // namespace heavykv::jinja
