// GPT-2's byte alphabet (each byte one printable code point, in UTF-8), written out independently
// of engine/tokenizer/bpe_tokenizer.cc, for tests and fuzzers that build byte-level vocabularies.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace heavykv::testing {

inline std::string ByteLevel(std::string_view bytes) {
  auto printable = [](uint32_t c) {
    return (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
  };
  std::string out;
  for (unsigned char b : bytes) {
    uint32_t cp = b;
    if (!printable(b)) {
      cp = 256;  // then the rank of b among the bytes that are not printable
      for (uint32_t c = 0; c < b; ++c) cp += printable(c) ? 0 : 1;
    }
    if (cp < 0x80) {
      out.push_back(char(cp));
    } else {
      out.push_back(char(0xC0 | (cp >> 6)));
      out.push_back(char(0x80 | (cp & 0x3F)));
    }
  }
  return out;
}

}  // namespace heavykv::testing
