#include "engine/tokenizer/gguf_tokenizer.h"

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "engine/tokenizer/special_tokens.h"

namespace heavykv {

namespace {

// tokenizer.ggml.model; NOT_FOUND without it.
absl::StatusOr<absl::string_view> TokenizerModel(const GgufFile& f) {
  if (f.FindMetadata("tokenizer.ggml.model") == nullptr) {
    return absl::NotFoundError(absl::StrCat(f.path(), ": no tokenizer (tokenizer.ggml.model)"));
  }
  return f.GetString("tokenizer.ggml.model");
}

// tokenizer.ggml.tokens, which must hold `vocab_size` entries.
absl::StatusOr<std::vector<absl::string_view>> Tokens(const GgufFile& f, int32_t vocab_size) {
  absl::StatusOr<std::vector<absl::string_view>> tokens = f.GetArrayString("tokenizer.ggml.tokens");
  if (!tokens.ok()) return tokens.status();
  if (tokens->size() != size_t(vocab_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.path(), ": tokenizer.ggml.tokens has ", tokens->size(),
                     " tokens but the model's vocabulary is ", vocab_size));
  }
  return tokens;
}

// tokenizer.ggml.token_type (empty when absent): one GGUF type 0..6 per token.
absl::StatusOr<std::vector<int32_t>> TokenTypes(const GgufFile& f, size_t n) {
  std::vector<int32_t> out;
  if (f.FindMetadata("tokenizer.ggml.token_type") == nullptr) return out;
  absl::StatusOr<std::vector<int64_t>> types = f.GetArrayI64("tokenizer.ggml.token_type");
  if (!types.ok()) return types.status();
  if (types->size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": tokenizer.ggml.token_type has ",
                                                   types->size(), " entries for ", n, " tokens"));
  }
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t t = (*types)[i];
    if (t < 0 || t > TextTokenizer::kByte) {
      return absl::InvalidArgumentError(absl::StrCat(f.path(), ": tokenizer.ggml.token_type[", i,
                                                     "] is ", t, " (GGUF types are 0..6)"));
    }
    out.push_back(int32_t(t));
  }
  return out;
}

// A token id key, if present: unchanged `*id` when absent, INVALID_ARGUMENT outside the vocabulary.
absl::Status ReadId(const GgufFile& f, const char* key, int32_t vocab_size, int32_t* id) {
  if (f.FindMetadata(key) == nullptr) return absl::OkStatus();
  absl::StatusOr<int64_t> value = f.GetI64(key);
  if (!value.ok()) return value.status();
  if (*value < 0 || *value >= vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": metadata key '", key, "' is ",
                                                   *value, ", outside the vocabulary of ",
                                                   vocab_size));
  }
  *id = int32_t(*value);
  return absl::OkStatus();
}

// A boolean key, if present.
absl::Status ReadFlag(const GgufFile& f, const char* key, std::optional<bool>* flag) {
  if (f.FindMetadata(key) == nullptr) return absl::OkStatus();
  absl::StatusOr<bool> value = f.GetBool(key);
  if (!value.ok()) return value.status();
  *flag = *value;
  return absl::OkStatus();
}

// The ids every tokenizer model shares: BOS, EOS, unknown, add_bos/add_eos, and what
// ApplyLlamaCppRules finds.
struct CommonIds {
  int32_t bos = -1, eos = -1, unknown = -1;
  std::vector<int32_t> eog;     // ends of generation besides EOS
  std::vector<int32_t> rstrip;  // special tokens that take the whitespace after them
  std::optional<bool> add_bos, add_eos;
};

absl::StatusOr<CommonIds> ReadCommonIds(const GgufFile& f, int32_t vocab_size, CommonIds ids) {
  for (const auto& [key, id] :
       {std::pair<const char*, int32_t*>{"tokenizer.ggml.bos_token_id", &ids.bos},
        {"tokenizer.ggml.eos_token_id", &ids.eos},
        {"tokenizer.ggml.unknown_token_id", &ids.unknown}}) {
    if (absl::Status s = ReadId(f, key, vocab_size, id); !s.ok()) return s;
  }
  if (absl::Status s = ReadFlag(f, "tokenizer.ggml.add_bos_token", &ids.add_bos); !s.ok()) return s;
  if (absl::Status s = ReadFlag(f, "tokenizer.ggml.add_eos_token", &ids.add_eos); !s.ok()) return s;
  return ids;
}

// A token role that llama.cpp finds by a key or, failing that, by the token's text.
struct Role {
  std::vector<const char*> keys;  // the current key, then the deprecated one
  bool strict;                    // an id outside the vocabulary is an error, not ignored
  bool ends_generation;
  std::vector<absl::string_view> texts;
};

// What llama.cpp decides from token texts and the model's name rather than from tokenizer.ggml.*
// keys (src/llama-vocab.cpp, llama_vocab::impl::load), so that heavykv encodes as it does:
//  - a token written like a turn end (IsTurnEndText) is a control token whatever its type says,
//    and so is one written like the EOT, EOM or a fill-in-the-middle token when the file names
//    none (<|fim_prefix|>, <｜fim▁begin｜>, <|file_sep|>, ...): without special parsing such text
//    stays text, and skip_special leaves the token out (Qwen2.5's and DeepSeek Coder's FIM tokens
//    are "user-defined" in their files);
//  - the EOT, EOM, FIM pad, repository and file-separator tokens end a generation;
//  - in a model named like Phi-3 (general.name), the special tokens other than <unk>, <s> and
//    <|endoftext|> take the whitespace after them, and so does </s> (Hugging Face's rstrip).
// Where several texts fit one role llama.cpp takes one (whichever its hash map lists first);
// heavykv takes them all. `types` ([vocab_size], GGUF token types) is updated in place.
absl::Status ApplyLlamaCppRules(const GgufFile& f, const std::vector<absl::string_view>& tokens,
                                std::vector<int32_t>* types, CommonIds* ids) {
  const int32_t n = int32_t(tokens.size());
  if (types->empty()) types->assign(size_t(n), TextTokenizer::kNormal);
  static const std::vector<Role> kRoles = {
      {{"tokenizer.ggml.eot_token_id"},
       true,
       true,
       {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>",
        "<｜end▁of▁sentence｜>"}},
      {{"tokenizer.ggml.eom_token_id"}, true, true, {"<|eom_id|>"}},
      {{"tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"},
       false,
       false,
       {"<|fim_prefix|>", "<fim-prefix>", "<｜fim▁begin｜>", "<PRE>"}},
      {{"tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"},
       false,
       false,
       {"<|fim_suffix|>", "<fim-suffix>", "<｜fim▁hole｜>", "<SUF>"}},
      {{"tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"},
       false,
       false,
       {"<|fim_middle|>", "<fim-middle>", "<｜fim▁end｜>", "<MID>"}},
      {{"tokenizer.ggml.fim_pad_token_id"}, false, true, {"<|fim_pad|>", "<fim-pad>", "<PAD>"}},
      {{"tokenizer.ggml.fim_rep_token_id"},
       false,
       true,
       {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>"}},
      {{"tokenizer.ggml.fim_sep_token_id"}, false, true, {"<|file_sep|>"}},
  };
  for (const Role& role : kRoles) {
    int32_t id = -1;
    for (const char* key : role.keys) {
      // A bad EOT / EOM id is an error (as before heavykv read the FIM keys); a bad FIM id is
      // ignored, as llama.cpp does, so that no model that loaded before fails now.
      if (absl::Status s = ReadId(f, key, n, &id); !s.ok() && role.strict) return s;
    }
    if (id >= 0) {
      if (role.ends_generation) ids->eog.push_back(id);
      continue;
    }
    for (int32_t t = 0; t < n; ++t) {
      for (absl::string_view text : role.texts) {
        if (tokens[t] != text) continue;
        (*types)[t] = TextTokenizer::kControl;
        if (role.ends_generation) ids->eog.push_back(t);
      }
    }
  }
  for (int32_t t = 0; t < n; ++t) {
    if (IsTurnEndText(std::string_view(tokens[t].data(), tokens[t].size()))) {
      (*types)[t] = TextTokenizer::kControl;
    }
  }

  if (f.FindMetadata("general.name") == nullptr) return absl::OkStatus();
  absl::StatusOr<absl::string_view> name = f.GetString("general.name");
  if (!name.ok()) return absl::OkStatus();  // not a string: no name rule, and the model loads
  const std::string lower = absl::AsciiStrToLower(*name);
  if (!absl::StrContains(lower, "phi-3") && !absl::StrContains(lower, "phi3")) {
    return absl::OkStatus();
  }
  for (int32_t t = 0; t < n; ++t) {
    const int32_t type = (*types)[t];
    const bool special = type == TextTokenizer::kControl || type == TextTokenizer::kUserDefined ||
                         type == TextTokenizer::kUnknown;
    if ((special && tokens[t] != "<unk>" && tokens[t] != "<s>" && tokens[t] != "<|endoftext|>") ||
        tokens[t] == "</s>") {
      ids->rstrip.push_back(t);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<TextTokenizer>> LoadGgufTextTokenizer(const GgufFile& f,
                                                                     int32_t vocab_size) {
  absl::StatusOr<absl::string_view> model = TokenizerModel(f);
  if (!model.ok()) return model.status();
  if (*model == "gpt2") {
    absl::StatusOr<BpeTokenizer> t = LoadGgufBpeTokenizer(f, vocab_size);
    if (!t.ok()) return t.status();
    return std::unique_ptr<TextTokenizer>(new BpeTokenizer(*std::move(t)));
  }
  absl::StatusOr<Tokenizer> t = LoadGgufTokenizer(f, vocab_size);
  if (!t.ok()) return t.status();
  return std::unique_ptr<TextTokenizer>(new Tokenizer(*std::move(t)));
}

absl::StatusOr<Tokenizer> LoadGgufTokenizer(const GgufFile& f, int32_t vocab_size) {
  absl::StatusOr<absl::string_view> model = TokenizerModel(f);
  if (!model.ok()) return model.status();
  if (*model != "llama") {
    return absl::UnimplementedError(absl::StrCat(
        f.path(), ": tokenizer model '", *model,
        "' is not supported (heavykv reads 'llama' SentencePiece and 'gpt2' byte-level BPE "
        "vocabularies); give --tokenizer FILE, or token ids"));
  }
  absl::StatusOr<std::vector<absl::string_view>> tokens = Tokens(f, vocab_size);
  if (!tokens.ok()) return tokens.status();
  absl::StatusOr<std::vector<float>> scores = f.GetArrayF32("tokenizer.ggml.scores");
  if (!scores.ok()) return scores.status();
  absl::StatusOr<std::vector<int32_t>> types = TokenTypes(f, tokens->size());
  if (!types.ok()) return types.status();
  CommonIds defaults;  // SentencePiece's: <unk> 0, <s> 1, </s> 2
  defaults.bos = kBosId;
  defaults.eos = kEosId;
  defaults.unknown = 0;
  absl::StatusOr<CommonIds> ids = ReadCommonIds(f, vocab_size, defaults);
  if (!ids.ok()) return ids.status();
  if (absl::Status s = ApplyLlamaCppRules(f, *tokens, &*types, &*ids); !s.ok()) return s;
  Tokenizer::SentencePieceOptions o;
  o.types = *std::move(types);
  o.bos_id = ids->bos;
  o.eos_id = ids->eos;
  o.add_bos = ids->add_bos.value_or(true);  // SentencePiece's default, as llama.cpp's
  o.add_eos = ids->add_eos.value_or(false);
  o.eog_ids = ids->eog;
  o.rstrip_ids = ids->rstrip;
  std::optional<bool> space_prefix;
  if (absl::Status s = ReadFlag(f, "tokenizer.ggml.add_space_prefix", &space_prefix); !s.ok()) {
    return s;
  }
  o.add_space_prefix = space_prefix.value_or(true);
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
  return Tokenizer::FromPieces(std::move(pieces), *std::move(scores), f.path(), std::move(o));
}

absl::StatusOr<BpeTokenizer> LoadGgufBpeTokenizer(const GgufFile& f, int32_t vocab_size) {
  absl::StatusOr<absl::string_view> model = TokenizerModel(f);
  if (!model.ok()) return model.status();
  if (*model != "gpt2") {
    return absl::UnimplementedError(
        absl::StrCat(f.path(), ": tokenizer model '", *model, "' is not byte-level BPE ('gpt2')"));
  }
  absl::StatusOr<std::vector<absl::string_view>> tokens = Tokens(f, vocab_size);
  if (!tokens.ok()) return tokens.status();
  absl::StatusOr<std::vector<int32_t>> types = TokenTypes(f, tokens->size());
  if (!types.ok()) return types.status();
  absl::StatusOr<CommonIds> ids = ReadCommonIds(f, vocab_size, CommonIds{});
  if (!ids.ok()) return ids.status();
  if (absl::Status s = ApplyLlamaCppRules(f, *tokens, &*types, &*ids); !s.ok()) return s;
  BpeTokenizer::Vocab vocab;
  vocab.tokens.reserve(tokens->size());
  for (absl::string_view t : *tokens) vocab.tokens.emplace_back(t);
  vocab.types = *std::move(types);
  absl::StatusOr<std::vector<absl::string_view>> merges = f.GetArrayString("tokenizer.ggml.merges");
  if (!merges.ok()) return merges.status();
  vocab.merges.reserve(merges->size());
  for (absl::string_view m : *merges) vocab.merges.emplace_back(m);
  if (f.FindMetadata("tokenizer.ggml.pre") != nullptr) {
    absl::StatusOr<absl::string_view> pre = f.GetString("tokenizer.ggml.pre");
    if (!pre.ok()) return pre.status();
    vocab.pre = std::string(*pre);
  }
  vocab.bos_id = ids->bos;
  vocab.eos_id = ids->eos;
  vocab.unknown_id = ids->unknown;
  vocab.eog_ids = ids->eog;
  vocab.rstrip_ids = ids->rstrip;
  vocab.add_bos = ids->add_bos;
  vocab.add_eos = ids->add_eos.value_or(false);
  return BpeTokenizer::Create(std::move(vocab), f.path());
}

}  // namespace heavykv
