// Fuzzes the byte-level BPE tokenizer (engine/tokenizer/bpe_tokenizer.h). Input layout:
//   byte 0: bit 7 clear: text mode. Bits 0-6 pick the pre-tokenizer (PreTokenizer::Names());
//           the rest of the input is text, encoded with a small GPT-2 style vocabulary (the 256
//           byte tokens, a few merges, overlapping control and user-defined tokens). Every id
//           must be in the vocabulary and the ids must decode to the text again.
//   bit 7 set: vocabulary mode. The rest is lines: tokens (in the byte-level alphabet or not), an
//           empty line, then merges "left right". Create must accept or refuse with
//           INVALID_ARGUMENT; an accepted vocabulary then encodes a fixed text.
// tests/fuzz/make_seed_corpus.sh writes seeds in this layout.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer/bpe_tokenizer.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/tokenizer/byte_level.h"

namespace {

using heavykv::testing::ByteLevel;

heavykv::BpeTokenizer::Vocab SmallVocab(const std::string& pre) {
  heavykv::BpeTokenizer::Vocab v;
  v.pre = pre;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(ByteLevel(std::string(1, char(b))));
  const char* merges[][2] = {{"t", "h"},       {"th", "e"},  {" ", "the"}, {"i", "n"},   {" ", "a"},
                             {"e", "r"},       {"o", "n"},   {" ", " "},   {"  ", "  "}, {"1", "2"},
                             {"\xC3", "\xA9"}, {"\n", "\n"}, {"in", "g"},  {" a", "n"}};
  for (const auto& m : merges) {
    const std::string merged = ByteLevel(std::string(m[0]) + m[1]);
    bool have = false;
    for (const std::string& t : v.tokens) have = have || t == merged;
    if (!have) v.tokens.push_back(merged);
    v.merges.push_back(ByteLevel(m[0]) + " " + ByteLevel(m[1]));
  }
  v.types.assign(v.tokens.size(), heavykv::BpeTokenizer::kNormal);
  for (const char* special : {"<|end|>", "<|end|><|x|>", "<|x|>", "<think>"}) {
    v.tokens.push_back(special);
    v.types.push_back(special[0] == '<' && special[1] == '|' ? heavykv::BpeTokenizer::kControl
                                                             : heavykv::BpeTokenizer::kUserDefined);
  }
  v.bos_id = int32_t(v.tokens.size()) - 4;
  v.eos_id = v.bos_id;
  return v;
}

const std::vector<heavykv::BpeTokenizer>& Tokenizers() {
  static const auto* toks = [] {
    auto* t = new std::vector<heavykv::BpeTokenizer>();
    for (const std::string& name : heavykv::PreTokenizer::Names()) {
      absl::StatusOr<heavykv::BpeTokenizer> tok =
          heavykv::BpeTokenizer::Create(SmallVocab(name), name);
      if (!tok.ok()) heavykv::fuzz::Die(std::string(tok.status().message()));
      t->push_back(*std::move(tok));
    }
    return t;
  }();
  return *toks;
}

void CheckEncode(const heavykv::BpeTokenizer& tok, std::string_view text, bool round_trip) {
  const std::vector<int32_t> ids = tok.Encode(text, /*bos=*/true, /*eos=*/true);
  std::string decoded;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= tok.vocab_size()) heavykv::fuzz::Die("Encode id outside the vocab");
    if (i != 0 && i + 1 != ids.size()) decoded += tok.Decode(ids[i]);
  }
  if (round_trip && decoded != text) heavykv::fuzz::Die("Decode(Encode(text)) != text");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if ((mode & 0x80) == 0) {
    const std::vector<heavykv::BpeTokenizer>& toks = Tokenizers();
    CheckEncode(toks[(mode & 0x7F) % toks.size()], rest, /*round_trip=*/true);
    return 0;
  }
  heavykv::BpeTokenizer::Vocab vocab;
  bool in_merges = false;
  for (size_t pos = 0; pos <= rest.size();) {
    size_t end = rest.find('\n', pos);
    if (end == std::string_view::npos) end = rest.size();
    const std::string line(rest.substr(pos, end - pos));
    if (line.empty() && !in_merges) {
      in_merges = true;
    } else {
      (in_merges ? vocab.merges : vocab.tokens).push_back(line);
    }
    pos = end + 1;
  }
  vocab.pre = heavykv::PreTokenizer::Names()[mode % heavykv::PreTokenizer::Names().size()];
  absl::StatusOr<heavykv::BpeTokenizer> tok = heavykv::BpeTokenizer::Create(vocab, "fuzz");
  if (!tok.ok()) {
    if (tok.status().code() != absl::StatusCode::kInvalidArgument) {
      heavykv::fuzz::Die("Create refused with a code other than INVALID_ARGUMENT");
    }
    return 0;
  }
  // Bytes the vocabulary has no token for are dropped, so no round trip here.
  CheckEncode(*tok, "the cat's 12 r\xC3\xA9sum\xC3\xA9s\n\n  in <|end|>\xFF", /*round_trip=*/false);
  return 0;
}
