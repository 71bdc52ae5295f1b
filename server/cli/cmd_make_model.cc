// heavykv make-model: writes a random-weight model at a named or explicit shape, as a llama2.c
// checkpoint (engine/model/make_model.h) or a GGUF file of llama, qwen2 or qwen3 architecture with
// llama.cpp's metadata, weight types and a vocabulary (engine/model/make_gguf_model.h).
#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "engine/gguf/gguf_weight_mix.h"
#include "engine/model/make_gguf_model.h"
#include "engine/model/make_model.h"
#include "server/cli/commands.h"
#include "server/flags/cli_flags.h"

namespace heavykv::cli {

int MakeModelCommand(int argc, char** argv) {
  std::string shape_name, out, format = "llama2c", arch_name, weight_type = "f32", vocab_from;
  std::string model_name;
  int64_t dim = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0, vocab = 0, seq_len = 0;
  int64_t head_size = 0, seed = 1;
  bool separate_classifier = false, tied = true;
  FlagSet flags(
      "make-model",
      absl::StrCat(
          "heavykv make-model (--shape NAME | --dim N --hidden-dim N --layers N --heads N "
          "[--kv-heads N] --vocab N --seq-len N) [--format gguf --arch A --weight-type T "
          "[--vocab-from F.gguf]] --out FILE\n"
          "shapes: ", NamedShapeList(), "\n"
          "gguf weight types: ", GgufWeightMixList(),
          " (q4_k_m, q5_k_m: llama-quantize's per-tensor mix; the others: every matrix that type, "
          "as llama-quantize --pure; norms and biases F32)"));
  flags.String("shape", &shape_name, "named shape; explicit dimension flags override its fields");
  flags.String("format", &format, "llama2c (a run.c checkpoint, llama only) or gguf");
  flags.String("arch", &arch_name,
               "gguf: llama, qwen2 (q/k/v biases, NEOX rope) or qwen3 (q/k norms, NEOX rope); "
               "default the shape's (llama without one)");
  flags.String("weight-type", &weight_type, "gguf: weight type or mix (see above)");
  flags.String("vocab-from", &vocab_from,
               "gguf: copy every tokenizer.* key of this GGUF file; the vocabulary size becomes "
               "its token count (default: a minimal SentencePiece vocabulary of --vocab pieces)");
  flags.Bool("tied", &tied,
             "gguf: the classifier is the token embedding (no output.weight); default the "
             "shape's (llama3.2-1b, qwen2.5-0.5b, qwen3-0.6b tie; llama3-8b does not), else tied");
  flags.String("name", &model_name, "gguf: general.name (default: random-SHAPE, or random)");
  flags.Int("dim", &dim, "model width");
  flags.Int("hidden-dim", &hidden, "feed-forward width");
  flags.Int("layers", &layers, "transformer layers");
  flags.Int("heads", &heads, "query heads");
  flags.Int("kv-heads", &kv_heads, "kv heads (grouped-query attention); 0 = heads");
  flags.Int("head-size", &head_size, "gguf: size of a head; 0 = dim / heads (qwen3-0.6b: 128)");
  flags.Int("vocab", &vocab, "vocabulary size");
  flags.Int("seq-len", &seq_len, "context length");
  flags.Int("seed", &seed, "weights seed");
  flags.Bool("separate-classifier", &separate_classifier,
             "write a classifier matrix of its own (= --tied=false)");
  flags.String("out", &out, "output file path (required)");
  if (std::optional<int> code = ParseOrExit(flags, argc, argv)) return *code;
  if (out.empty()) return Fail(absl::InvalidArgumentError("--out is required"));
  if (format != "llama2c" && format != "gguf") {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("unknown --format \"", format, "\"; choose llama2c or gguf")));
  }
  const bool gguf = format == "gguf";
  for (const char* flag : {"arch", "weight-type", "vocab-from", "tied", "name", "head-size"}) {
    if (!gguf && flags.IsSet(flag)) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--", flag, " applies to --format gguf only")));
    }
  }
  ModelConfig c;
  if (!shape_name.empty()) {
    absl::StatusOr<ModelConfig> named = NamedShape(shape_name);
    if (!named.ok()) return Fail(named.status());
    c = *named;
  }
  if (!arch_name.empty()) {
    absl::StatusOr<Architecture> arch = ParseArchitecture(arch_name);
    if (!arch.ok()) return Fail(arch.status());
    if (*arch != c.arch) SetArchitecture(*arch, &c);
  }
  absl::StatusOr<GgufWeightMix> mix = ParseGgufWeightMix(weight_type);
  if (!mix.ok()) return Fail(mix.status());
  auto override_dim = [](int64_t v, int32_t& field) {
    if (v > 0) field = static_cast<int32_t>(std::min<int64_t>(v, INT32_MAX));
  };
  override_dim(dim, c.dim);
  override_dim(hidden, c.hidden_dim);
  override_dim(layers, c.num_layers);
  override_dim(heads, c.num_heads);
  override_dim(vocab, c.vocab_size);
  override_dim(seq_len, c.seq_len);
  override_dim(head_size, c.head_size);
  if (kv_heads > 0) {
    c.num_kv_heads = static_cast<int32_t>(kv_heads);
  } else if (c.num_kv_heads == 0 || heads > 0) {  // new head count: plain multi-head attention
    c.num_kv_heads = c.num_heads;
  }
  if (!gguf) {
    c.shared_classifier = !separate_classifier;  // llama2.c: shared unless asked, as before
  } else if (flags.IsSet("tied") || separate_classifier) {
    c.shared_classifier = tied && !separate_classifier;
  } else if (shape_name.empty()) {
    c.shared_classifier = true;
  }
  if (!gguf) {
    if (absl::Status v = c.Validate(); !v.ok()) return Fail(v);
    if (absl::Status w = WriteRandomModel(c, static_cast<uint64_t>(seed), out); !w.ok()) {
      return Fail(w);
    }
  } else {
    RandomGgufOptions o;
    o.config = c;
    o.weights = *mix;
    o.seed = static_cast<uint64_t>(seed);
    o.name = !model_name.empty() ? model_name
             : shape_name.empty() ? std::string("random")
                                  : absl::StrCat("random-", shape_name);
    o.vocab_from = vocab_from;
    if (!vocab_from.empty() && vocab > 0) {
      return Fail(absl::InvalidArgumentError(
          "--vocab and --vocab-from conflict: the vocabulary file sets the size"));
    }
    if (isatty(STDERR_FILENO)) {  // a big model takes minutes: show how far it is
      o.progress = [last = int64_t{-1}](int64_t done, int64_t total) mutable {
        const int64_t percent = total > 0 ? done * 100 / total : 100;
        if (percent == last) return;
        last = percent;
        std::fprintf(stderr, "\rwriting tensors: %3lld%%", static_cast<long long>(percent));
        if (done == total) std::fprintf(stderr, "\n");
      };
    }
    absl::StatusOr<ModelConfig> written = WriteRandomGgufModel(o, out);
    if (!written.ok()) return Fail(written.status());
    c = *written;
  }
  std::fprintf(stderr,
               "wrote %s: %s%s%s dim %d hidden %d layers %d heads %d/%d head size %d vocab %d "
               "seq_len %d%s (%.1fM params)\n",
               out.c_str(), gguf ? "gguf " : "", gguf ? ArchitectureName(c.arch) : "llama2.c",
               gguf ? absl::StrCat(" ", mix->name).c_str() : "", c.dim, c.hidden_dim,
               c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim(), c.vocab_size, c.seq_len,
               c.shared_classifier ? " tied" : "", c.NumParams() / 1e6);
  return 0;
}

}  // namespace heavykv::cli
