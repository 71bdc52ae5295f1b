// heavykv make-model: writes a random-weight llama2.c checkpoint at a named or explicit shape.
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "engine/make_model.h"
#include "server/cli_flags.h"
#include "server/commands.h"

namespace heavykv::cli {

int MakeModelCommand(int argc, char** argv) {
  std::string shape_name, out;
  int64_t dim = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0, vocab = 0, seq_len = 0;
  int64_t seed = 1;
  bool separate_classifier = false;
  FlagSet flags("make-model",
                absl::StrCat("heavykv make-model (--shape NAME | --dim N --hidden-dim N --layers N "
                             "--heads N [--kv-heads N] --vocab N --seq-len N) --out FILE\n"
                             "shapes: ", NamedShapeList()));
  flags.String("shape", &shape_name, "named shape; explicit dimension flags override its fields");
  flags.Int("dim", &dim, "model width");
  flags.Int("hidden-dim", &hidden, "feed-forward width");
  flags.Int("layers", &layers, "transformer layers");
  flags.Int("heads", &heads, "query heads");
  flags.Int("kv-heads", &kv_heads, "kv heads (grouped-query attention); 0 = heads");
  flags.Int("vocab", &vocab, "vocabulary size");
  flags.Int("seq-len", &seq_len, "context length");
  flags.Int("seed", &seed, "weights seed");
  flags.Bool("separate-classifier", &separate_classifier, "write a classifier matrix of its own");
  flags.String("out", &out, "output checkpoint path (required)");
  if (std::optional<int> code = ParseOrExit(flags, argc, argv)) return *code;
  if (out.empty()) return Fail(absl::InvalidArgumentError("--out is required"));
  ModelConfig c;
  if (!shape_name.empty()) {
    absl::StatusOr<ModelConfig> named = NamedShape(shape_name);
    if (!named.ok()) return Fail(named.status());
    c = *named;
  }
  auto override_dim = [](int64_t v, int32_t& field) {
    if (v > 0) field = static_cast<int32_t>(std::min<int64_t>(v, INT32_MAX));
  };
  override_dim(dim, c.dim);
  override_dim(hidden, c.hidden_dim);
  override_dim(layers, c.num_layers);
  override_dim(heads, c.num_heads);
  override_dim(vocab, c.vocab_size);
  override_dim(seq_len, c.seq_len);
  if (kv_heads > 0) {
    c.num_kv_heads = static_cast<int32_t>(kv_heads);
  } else if (c.num_kv_heads == 0 || heads > 0) {  // new head count: plain multi-head attention
    c.num_kv_heads = c.num_heads;
  }
  c.shared_classifier = !separate_classifier;
  if (absl::Status v = c.Validate(); !v.ok()) return Fail(v);
  if (absl::Status w = WriteRandomModel(c, static_cast<uint64_t>(seed), out); !w.ok()) {
    return Fail(w);
  }
  std::fprintf(stderr,
               "wrote %s: dim %d hidden %d layers %d heads %d/%d vocab %d seq_len %d (%.1fM "
               "params)\n",
               out.c_str(), c.dim, c.hidden_dim, c.num_layers, c.num_heads, c.num_kv_heads,
               c.vocab_size, c.seq_len, c.NumParams() / 1e6);
  return 0;
}

}  // namespace heavykv::cli
