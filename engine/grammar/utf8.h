// UTF-8 for the grammar compilers: a code point's bytes (the compilers write literals and
// classes of code points; grammar.h matches bytes).
#pragma once

#include <cstdint>
#include <string>

namespace heavykv::grammar {

// The UTF-8 bytes of `cp` (at most 0x10FFFF; a surrogate is written as its three bytes).
inline std::string EncodeUtf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xF0 | (cp >> 18));
    s += char(0x80 | ((cp >> 12) & 0x3F));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

}  // namespace heavykv::grammar
