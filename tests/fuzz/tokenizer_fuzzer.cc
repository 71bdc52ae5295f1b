// Fuzzes the SentencePiece-style tokenizer (engine/tokenizer/tokenizer.h): loading a llama2.c
// tokenizer file, Encode and Decode with run.c's rules, then the same pieces and scores as a GGUF
// SentencePiece vocabulary (FromPieces with SentencePieceOptions) whose token types and flags come
// from the input too. Input layout (little-endian):
//   uint16 vocab_size - 259 | uint16 text length | text bytes | tokenizer file (the rest)
// so a fuzzer mutates the vocabulary and the text together; tests/fuzz/make_seed_corpus.sh
// writes inputs in this layout. Every id Encode returns must be inside the vocabulary, and with
// SentencePiece's rules the ids must decode to the text again (less the dummy-prefix space) when
// no special token is involved.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using heavykv::Tokenizer;

// GGUF token types for `tok`'s pieces: <unk> unknown, <s> and </s> control, ids 3..258 bytes,
// and the rest mostly normal, one in three of another type picked by the input's bytes `seed`.
std::vector<int32_t> FuzzTypes(const Tokenizer& tok, std::string_view seed) {
  std::vector<int32_t> types(size_t(tok.vocab_size()), Tokenizer::kNormal);
  types[0] = Tokenizer::kUnknown;
  types[1] = types[2] = Tokenizer::kControl;
  for (int32_t id = 3; id < 259; ++id) types[id] = Tokenizer::kByte;
  if (seed.empty()) return types;
  static constexpr int32_t kOthers[] = {Tokenizer::kUnknown,     Tokenizer::kControl,
                                        Tokenizer::kUserDefined, Tokenizer::kUnused,
                                        Tokenizer::kByte,        0};
  for (int32_t id = 259; id < tok.vocab_size(); ++id) {
    const auto b = static_cast<unsigned char>(seed[size_t(id) % seed.size()]);
    if (b % 18 < 6) types[id] = kOthers[b % 18];
  }
  return types;
}

// Whether ids 3..258 are the byte tokens <0x00>..<0xFF>, which byte fallback assumes (the GGUF
// loader refuses other vocabularies).
bool HasByteTokens(const Tokenizer& tok) {
  for (int b = 0; b < 256; ++b) {
    char want[8];
    std::snprintf(want, sizeof want, "<0x%02X>", b);
    if (tok.piece(b + 3) != want) return false;
  }
  return true;
}

void CheckSentencePiece(const Tokenizer& llama2c, std::string_view text, std::string_view seed) {
  uint8_t flags = 0;
  for (char c : seed.substr(0, 64)) flags = uint8_t(flags * 31 + static_cast<unsigned char>(c));
  Tokenizer::SentencePieceOptions o;
  o.types = FuzzTypes(llama2c, seed);
  o.bos_id = flags & 1 ? heavykv::kBosId : -1;
  o.eos_id = flags & 2 ? heavykv::kEosId : -1;
  o.add_bos = flags & 4;
  o.add_space_prefix = !(flags & 8);
  if (flags & 16) o.eog_ids.push_back(llama2c.vocab_size() - 1);
  // Some special tokens take the whitespace after them (Phi-3's rule).
  for (int32_t id = 0; id < llama2c.vocab_size() && (flags & 32); id += 3) {
    if (o.types[id] == Tokenizer::kControl || o.types[id] == Tokenizer::kUserDefined) {
      o.rstrip_ids.push_back(id);
    }
  }
  const std::vector<int32_t> types = o.types;
  const bool space_prefix = o.add_space_prefix;
  std::vector<std::string> pieces;
  std::vector<float> scores;
  for (int32_t id = 0; id < llama2c.vocab_size(); ++id) {
    pieces.push_back(llama2c.piece(id));
    scores.push_back(llama2c.score(id));
  }
  absl::StatusOr<Tokenizer> tok =
      Tokenizer::FromPieces(std::move(pieces), std::move(scores), "fuzz", std::move(o));
  if (!tok.ok()) heavykv::fuzz::Die("FromPieces refused a loaded vocabulary");
  const bool byte_tokens = HasByteTokens(*tok);
  for (bool parse_special : {false, true}) {
    for (bool bos : {false, true}) {
      const std::vector<int32_t> ids =
          *tok->Encode(text, bos, /*eos=*/false, std::function<bool()>(), parse_special);
      if (bos && tok->bos_id() >= 0 && (ids.empty() || ids[0] != tok->bos_id())) {
        heavykv::fuzz::Die("Encode with BOS does not start with BOS");
      }
      const size_t first = bos && tok->bos_id() >= 0 ? 1 : 0;
      int32_t prev = first == 1 ? tok->bos_id() : -1;
      std::string decoded;
      bool special = false;
      for (size_t i = 0; i < ids.size(); ++i) {
        const int32_t id = ids[i];
        if (id < 0 || id >= tok->vocab_size()) heavykv::fuzz::Die("Encode id outside the vocab");
        if (i < first) continue;
        special = special || types[size_t(id)] == Tokenizer::kControl ||
                  types[size_t(id)] == Tokenizer::kUnknown ||
                  types[size_t(id)] == Tokenizer::kUserDefined;
        decoded += tok->Decode(prev, id);
        prev = id;
      }
      // The round trip holds for plain text: no special token matched or merged into, and no
      // "<0xNN>" written in the text (that merges into a byte token, as in llama.cpp).
      if (special || !byte_tokens || text.find('<') != std::string_view::npos) continue;
      std::string want(text);
      if (space_prefix && !text.empty() && first == 0) want.insert(0, " ");
      if (decoded != want) heavykv::fuzz::Die("SentencePiece Decode(Encode(text)) != text");
    }
  }
}

}  // namespace

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
  absl::StatusOr<Tokenizer> tok = Tokenizer::Load(path, 259 + vocab_extra);
  if (!tok.ok()) return 0;
  for (bool bos : {false, true}) {
    std::vector<int32_t> ids = tok->Encode(text, bos, /*eos=*/!bos);
    int32_t prev = bos ? heavykv::kBosId : 0;
    for (int32_t id : ids) {
      if (id < 0 || id >= tok->vocab_size()) heavykv::fuzz::Die("Encode id outside the vocab");
      std::string piece = tok->Decode(prev, id);
      Tokenizer::IsPrintablePiece(piece);
      prev = id;
    }
  }
  CheckSentencePiece(
      *tok, text,
      std::string_view(reinterpret_cast<const char*>(data + text_len), size - text_len));
  return 0;
}
