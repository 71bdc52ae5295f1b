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

absl::StatusOr<BpeTokenizer> LoadGgufBpeTokenizer(const GgufFile& f, int32_t vocab_size) {
  if (f.FindMetadata("tokenizer.ggml.model") == nullptr) {
    return absl::NotFoundError(absl::StrCat(f.path(), ": no tokenizer (tokenizer.ggml.model)"));
  }
  absl::StatusOr<absl::string_view> model = f.GetString("tokenizer.ggml.model");
  if (!model.ok()) return model.status();
  if (*model != "gpt2") {
    return absl::UnimplementedError(
        absl::StrCat(f.path(), ": tokenizer model '", *model, "' is not byte-level BPE ('gpt2')"));
  }
  BpeTokenizer::Vocab vocab;
  absl::StatusOr<std::vector<absl::string_view>> tokens = f.GetArrayString("tokenizer.ggml.tokens");
  if (!tokens.ok()) return tokens.status();
  if (tokens->size() != size_t(vocab_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.path(), ": tokenizer.ggml.tokens has ", tokens->size(),
                     " tokens but the model's vocabulary is ", vocab_size));
  }
  vocab.tokens.reserve(tokens->size());
  for (absl::string_view t : *tokens) vocab.tokens.emplace_back(t);
  if (f.FindMetadata("tokenizer.ggml.token_type") != nullptr) {
    absl::StatusOr<std::vector<int64_t>> types = f.GetArrayI64("tokenizer.ggml.token_type");
    if (!types.ok()) return types.status();
    if (types->size() != tokens->size()) {
      return absl::InvalidArgumentError(absl::StrCat(f.path(), ": tokenizer.ggml.token_type has ",
                                                     types->size(), " entries for ", tokens->size(),
                                                     " tokens"));
    }
    vocab.types.reserve(types->size());
    for (size_t i = 0; i < types->size(); ++i) {
      const int64_t t = (*types)[i];
      if (t < 0 || t > BpeTokenizer::kByte) {
        return absl::InvalidArgumentError(absl::StrCat(f.path(), ": tokenizer.ggml.token_type[", i,
                                                       "] is ", t, " (GGUF types are 0..6)"));
      }
      vocab.types.push_back(int32_t(t));
    }
  }
  absl::StatusOr<std::vector<absl::string_view>> merges = f.GetArrayString("tokenizer.ggml.merges");
  if (!merges.ok()) return merges.status();
  vocab.merges.reserve(merges->size());
  for (absl::string_view m : *merges) vocab.merges.emplace_back(m);
  if (f.FindMetadata("tokenizer.ggml.pre") != nullptr) {
    absl::StatusOr<absl::string_view> pre = f.GetString("tokenizer.ggml.pre");
    if (!pre.ok()) return pre.status();
    vocab.pre = std::string(*pre);
  }
  for (const auto& [key, id] :
       {std::pair<const char*, int32_t*>{"tokenizer.ggml.bos_token_id", &vocab.bos_id},
        {"tokenizer.ggml.eos_token_id", &vocab.eos_id},
        {"tokenizer.ggml.unknown_token_id", &vocab.unknown_id}}) {
    if (f.FindMetadata(key) == nullptr) continue;
    absl::StatusOr<int64_t> value = f.GetI64(key);
    if (!value.ok()) return value.status();
    if (*value < 0 || *value >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(f.path(), ": metadata key '", key, "' is ",
                                                     *value, ", outside the vocabulary of ",
                                                     vocab_size));
    }
    *id = int32_t(*value);
  }
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    if (f.FindMetadata(key) == nullptr) continue;
    absl::StatusOr<int64_t> value = f.GetI64(key);
    if (!value.ok()) return value.status();
    if (*value < 0 || *value >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(f.path(), ": metadata key '", key, "' is ",
                                                     *value, ", outside the vocabulary of ",
                                                     vocab_size));
    }
    vocab.eog_ids.push_back(int32_t(*value));
  }
  if (f.FindMetadata("tokenizer.ggml.add_bos_token") != nullptr) {
    absl::StatusOr<bool> add = f.GetBool("tokenizer.ggml.add_bos_token");
    if (!add.ok()) return add.status();
    vocab.add_bos = *add;
  }
  if (f.FindMetadata("tokenizer.ggml.add_eos_token") != nullptr) {
    absl::StatusOr<bool> add = f.GetBool("tokenizer.ggml.add_eos_token");
    if (!add.ok()) return add.status();
    vocab.add_eos = *add;
  }
  return BpeTokenizer::Create(std::move(vocab), f.path());
}

}  // namespace heavykv
