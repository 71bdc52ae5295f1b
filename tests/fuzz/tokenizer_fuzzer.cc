// Fuzzes the llama2.c tokenizer (engine/tokenizer.h): loading a tokenizer file, then Encode and
// Decode on arbitrary text. Input layout (little-endian):
//   uint16 vocab_size - 259 | uint16 text length | text bytes | tokenizer file (the rest)
// so a fuzzer mutates the vocabulary and the text together; tests/fuzz/make_seed_corpus.sh
// writes inputs in this layout. Every id Encode returns must be inside the vocabulary.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "engine/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const heavykv::fuzz::ScratchFile* file =
      new heavykv::fuzz::ScratchFile("heavykv_tokenizer_fuzz");
  if (size < 4) return 0;
  uint16_t vocab_extra, text_len;
  std::memcpy(&vocab_extra, data, 2);
  std::memcpy(&text_len, data + 2, 2);
  data += 4;
  size -= 4;
  if (text_len > size) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data), text_len);
  const std::string& path = file->Write(data + text_len, size - text_len);
  // 259 = 3 special + 256 byte-fallback tokens, the smallest vocabulary Load accepts.
  absl::StatusOr<heavykv::Tokenizer> tok = heavykv::Tokenizer::Load(path, 259 + vocab_extra);
  if (!tok.ok()) return 0;
  for (bool bos : {false, true}) {
    std::vector<int32_t> ids = tok->Encode(text, bos, /*eos=*/!bos);
    int32_t prev = bos ? heavykv::kBosId : 0;
    for (int32_t id : ids) {
      if (id < 0 || id >= tok->vocab_size()) heavykv::fuzz::Die("Encode id outside the vocab");
      std::string piece = tok->Decode(prev, id);
      heavykv::Tokenizer::IsPrintablePiece(piece);
      prev = id;
    }
  }
  return 0;
}
