#include "engine/gguf_tokenizer.h"

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace heavykv {

absl::StatusOr<Tokenizer> LoadGgufTokenizer(const GgufFile& f, int32_t vocab_size) {
  if (f.FindMetadata("tokenizer.ggml.model") == nullptr) {
    return absl::NotFoundError(absl::StrCat(f.path(), ": no tokenizer (tokenizer.ggml.model)"));
  }
  absl::StatusOr<absl::string_view> model = f.GetString("tokenizer.ggml.model");
  if (!model.ok()) return model.status();
  if (*model != "llama") {
    return absl::UnimplementedError(absl::StrCat(
        f.path(), ": tokenizer model '", *model,
        "' is not supported yet (heavykv runs 'llama' SentencePiece vocabularies); give "
        "--tokenizer FILE, or token ids"));
  }
  absl::StatusOr<std::vector<absl::string_view>> tokens = f.GetArrayString("tokenizer.ggml.tokens");
  if (!tokens.ok()) return tokens.status();
  absl::StatusOr<std::vector<float>> scores = f.GetArrayF32("tokenizer.ggml.scores");
  if (!scores.ok()) return scores.status();
  if (tokens->size() != size_t(vocab_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.path(), ": tokenizer.ggml.tokens has ", tokens->size(),
                     " tokens but the model's vocabulary is ", vocab_size));
  }
  for (const auto& [key, want] :
       {std::pair<const char*, int64_t>{"tokenizer.ggml.unknown_token_id", 0},
        {"tokenizer.ggml.bos_token_id", kBosId},
        {"tokenizer.ggml.eos_token_id", kEosId}}) {
    if (f.FindMetadata(key) == nullptr) continue;
    absl::StatusOr<int64_t> id = f.GetI64(key);
    if (!id.ok()) return id.status();
    if (*id != want) {
      return absl::UnimplementedError(absl::StrCat(f.path(), ": metadata key '", key, "' is ", *id,
                                                   "; heavykv's SentencePiece has ", want));
    }
  }
  std::vector<std::string> pieces;
  pieces.reserve(tokens->size());
  for (absl::string_view t : *tokens)
    pieces.push_back(absl::StrReplaceAll(t, {{"\xE2\x96\x81", " "}}));
  // Byte fallback maps byte b to id b + 3 (Tokenizer::Encode): the vocabulary must agree.
  for (int b = 0; b < 256 && size_t(b + 3) < pieces.size(); ++b) {
    char want[8];
    std::snprintf(want, sizeof want, "<0x%02X>", b);
    if (pieces[b + 3] != want) {
      return absl::InvalidArgumentError(
          absl::StrCat(f.path(), ": tokenizer.ggml.tokens[", b + 3, "] is '", pieces[b + 3],
                       "', not ", want, " (byte-fallback tokens must follow <unk>, <s>, </s>)"));
    }
  }
  return Tokenizer::FromPieces(std::move(pieces), *std::move(scores), f.path());
}

}  // namespace heavykv
