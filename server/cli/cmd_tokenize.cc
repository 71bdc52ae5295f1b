// heavykv tokenize --model MODEL [--tokenizer FILE] [--no-bos] [--ids] (TEXT... | --file F): the
// ids a model's tokenizer gives a text, as the server's Tokenize RPC gives them (special tokens
// written in the text are parsed). Only the tokenizer is loaded: a GGUF file's from its metadata
// (the vocabulary size is its tokenizer.ggml.tokens count), a llama2.c checkpoint's header for the
// vocabulary size of --tokenizer; never the weights.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/gguf/gguf.h"
#include "engine/model/model.h"
#include "engine/tokenizer/text_stream.h"
#include "server/cli/commands.h"
#include "server/flags/cli_flags.h"

namespace heavykv::cli {
namespace {

// The vocabulary size the tokenizer is loaded with: a GGUF tokenizer's own token count, else
// (a --tokenizer file, which does not say) the model header's.
absl::StatusOr<int32_t> VocabSize(const std::string& model_path, bool gguf_tokenizer) {
  if (!gguf_tokenizer) {
    absl::StatusOr<ModelConfig> c = ReadModelConfig(model_path);
    if (!c.ok()) return c.status();
    return c->vocab_size;
  }
  absl::StatusOr<GgufFile> file = GgufFile::Open(model_path);
  if (!file.ok()) return file.status();
  const GgufMetadata* tokens = file->FindMetadata("tokenizer.ggml.tokens");
  if (tokens == nullptr || !tokens->is_array() ||
      tokens->count > uint64_t(std::numeric_limits<int32_t>::max())) {
    return absl::NotFoundError(absl::StrCat(
        model_path, " has no tokenizer.ggml.tokens list: give a llama2.c --tokenizer FILE"));
  }
  return static_cast<int32_t>(tokens->count);
}

// A token's bytes for a terminal: whole UTF-8 characters as they are; control bytes, DEL and
// bytes that are not part of a whole character (a byte token's half of one) as \xNN; a
// backslash as \\.
std::string Printable(std::string_view bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size();) {
    const auto c = static_cast<uint8_t>(bytes[i]);
    const size_t n = TextStream::WholeCharLength(absl::string_view(bytes.data() + i, bytes.size() - i));
    if (c == '\\') {
      out += "\\\\";
    } else if (n == 0 || c < 0x20 || c == 0x7F) {
      absl::StrAppendFormat(&out, "\\x%02x", c);
    } else {
      out.append(bytes.substr(i, n));
      i += n;
      continue;
    }
    ++i;
  }
  return out;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const TextTokenizer>> LoadTokenizerOnly(
    const std::string& model_path, const std::string& tokenizer_path) {
  if (!std::ifstream(model_path)) {
    return absl::NotFoundError(absl::StrCat("cannot open model file ", model_path));
  }
  const bool gguf_tokenizer = tokenizer_path.empty() && IsGgufFile(model_path);
  if (tokenizer_path.empty() && !gguf_tokenizer) {
    return absl::InvalidArgumentError(absl::StrCat(
        model_path, " is a llama2.c checkpoint: give its --tokenizer FILE (tokenizer.bin)"));
  }
  absl::StatusOr<int32_t> vocab_size = VocabSize(model_path, gguf_tokenizer);
  if (!vocab_size.ok()) return vocab_size.status();
  absl::StatusOr<std::shared_ptr<const TextTokenizer>> tok =
      LoadOptionalTokenizer(tokenizer_path, model_path, *vocab_size);
  if (!tok.ok()) return tok.status();
  if (*tok == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        model_path, " has no tokenizer heavykv reads: give a llama2.c --tokenizer FILE"));
  }
  return tok;
}

int TokenizeCommand(int argc, char** argv) {
  std::string model_path, tokenizer_path, text_path;
  bool no_bos = false, ids_only = false;
  FlagSet flags("tokenize",
                "heavykv tokenize --model MODEL [--tokenizer FILE] [--no-bos] [--ids] "
                "(TEXT... | --file FILE)\n"
                "The tokens of TEXT (the arguments joined by spaces; special tokens such as\n"
                "<|im_end|> written in it are parsed), one line per token:\n"
                "  ID<TAB>PIECE\n"
                "PIECE is the bytes the token adds to the decoded text: whole UTF-8 characters\n"
                "as they are; control bytes, DEL and bytes of a partial character as \\xNN; a\n"
                "backslash as \\\\. With --ids: one JSON array of the ids, e.g. [128000, 9906].");
  flags.String("model", &model_path,
               "GGUF model (its own tokenizer) or llama2.c checkpoint (with --tokenizer)");
  flags.String("tokenizer", &tokenizer_path,
               "llama2.c tokenizer.bin (default: a GGUF model's own)");
  flags.Bool("no-bos", &no_bos,
             "no BOS/EOS (Tokenize add_special_tokens=false); unset: as the tokenizer adds them");
  flags.Bool("ids", &ids_only, "print only a JSON array of the ids");
  flags.String("file", &text_path, "tokenize this file's bytes instead of TEXT");
  if (std::optional<int> code = ParseOrExit(flags, argc, argv)) return *code;
  if (model_path.empty()) return Fail(absl::InvalidArgumentError("--model is required"));
  if (flags.positional().empty() == text_path.empty()) {
    return Fail(absl::InvalidArgumentError("give the TEXT to tokenize, or --file FILE"));
  }
  std::string text = absl::StrJoin(flags.positional(), " ");
  if (!text_path.empty()) {
    std::ifstream in(text_path, std::ios::binary);
    if (!in) return Fail(absl::NotFoundError(absl::StrCat("cannot open --file ", text_path)));
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  absl::StatusOr<std::shared_ptr<const TextTokenizer>> tok =
      LoadTokenizerOnly(model_path, tokenizer_path);
  if (!tok.ok()) return Fail(tok.status());
  const TextTokenizer& t = **tok;
  const std::vector<int32_t> ids = t.Encode(text, !no_bos && t.add_bos(), !no_bos && t.add_eos());

  if (ids_only) {
    std::printf("[%s]\n", absl::StrJoin(ids, ", ").c_str());
    return 0;
  }
  std::string out;
  int32_t prev = -1;
  for (int32_t id : ids) {
    absl::StrAppend(&out, id, "\t", Printable(t.Decode(prev, id)), "\n");
    prev = id;
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace heavykv::cli
