#include "engine/model/make_gguf_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/gguf/gguf.h"
#include "engine/gguf/gguf_writer.h"
#include "kernels/cpu/quant_types.h"

namespace heavykv {
namespace {

constexpr float kBiasScale = 0.02f;
constexpr int64_t kChunkElements = int64_t(1) << 22;  // floats drawn per write

uint64_t SplitMix(uint64_t x) {  // splitmix64's finalizer: a bijective scramble
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t NameHash(const std::string& s) {  // FNV-1a
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001B3ull;
  return h;
}

void AddTensor(std::vector<RandomTensorPlan>* out, std::string name, std::vector<int64_t> dims,
               float scale, bool constant) {
  out->push_back({std::move(name), std::move(dims), GgmlType::kF32, scale, constant});
}

// The metadata keys llama.cpp's convert_hf_to_gguf.py writes for these architectures, in its
// order (gguf-py's writer puts general.architecture first).
void AddModelMetadata(const RandomGgufOptions& o, const ModelConfig& c, GgufWriter* w) {
  const std::string a = ArchitectureName(c.arch);
  w->AddString("general.architecture", a);
  w->AddString("general.name", o.name);
  w->AddU32(a + ".block_count", c.num_layers);
  w->AddU32(a + ".context_length", c.seq_len);
  w->AddU32(a + ".embedding_length", c.dim);
  w->AddU32(a + ".feed_forward_length", c.hidden_dim);
  w->AddU32(a + ".attention.head_count", c.num_heads);
  w->AddU32(a + ".attention.head_count_kv", c.num_kv_heads);
  w->AddF32(a + ".rope.freq_base", c.rope_theta);
  w->AddF32(a + ".attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  // Hugging Face configs with a head_dim (Qwen3, wider heads) make the converter write these.
  if (c.arch == Architecture::kQwen3 || c.q_dim() != c.dim) {
    w->AddU32(a + ".attention.key_length", c.head_dim());
    w->AddU32(a + ".attention.value_length", c.head_dim());
  }
  w->AddU32("general.file_type", o.weights.file_type);
  if (c.arch == Architecture::kLlama) {  // LlamaModel.set_gguf_parameters
    w->AddU32(a + ".vocab_size", c.vocab_size);
    w->AddU32(a + ".rope.dimension_count", c.head_dim());
  }
}

// A SentencePiece vocabulary that both llama.cpp and heavykv's tokenizer load: <unk>, <s>,
// </s>, the 256 byte-fallback pieces, then a space, the printable ASCII characters and numbered
// filler pieces up to `size`.
void AddMinimalVocab(int32_t size, GgufWriter* w) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores(3, 0.0f);
  std::vector<int32_t> types = {2, 3, 3};  // llama_token_type: UNKNOWN, CONTROL
  for (int b = 0; b < 256; ++b) {
    char piece[8];
    std::snprintf(piece, sizeof piece, "<0x%02X>", b);
    tokens.push_back(piece);
    scores.push_back(0.0f);
    types.push_back(6);  // BYTE
  }
  for (int32_t i = 0; int32_t(tokens.size()) < size; ++i) {
    if (i == 0) {
      tokens.push_back("\xE2\x96\x81");  // U+2581, SentencePiece's space
    } else if (i < 95) {
      tokens.push_back(std::string(1, char(' ' + i)));
    } else {
      tokens.push_back(absl::StrCat("\xE2\x96\x81t", i));
    }
    scores.push_back(-float(i));
    types.push_back(1);  // NORMAL
  }
  w->AddString("tokenizer.ggml.model", "llama");
  w->AddArrayString("tokenizer.ggml.tokens", tokens);
  w->AddArrayF32("tokenizer.ggml.scores", scores);
  w->AddArrayI32("tokenizer.ggml.token_type", types);
  w->AddU32("tokenizer.ggml.unknown_token_id", 0);
  w->AddU32("tokenizer.ggml.bos_token_id", 1);
  w->AddU32("tokenizer.ggml.eos_token_id", 2);
}

// Draws and encodes `rows` rows from `first_row` into out (their bytes, consecutive).
void EncodeRows(const RandomTensorPlan& t, uint64_t seed, int64_t first_row, int64_t rows,
                cpu::QuantType q, int64_t row_bytes, uint8_t* out) {
  const int64_t cols = t.dims[0];
#pragma omp parallel
  {
    std::vector<float> row(cols);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      DrawRandomRow(t, seed, first_row + r, row.data());
      cpu::QuantizeRow(q, row.data(), out + r * row_bytes, cols);
    }
  }
}

}  // namespace

std::vector<RandomTensorPlan> PlanRandomGgufTensors(const ModelConfig& c,
                                                    const GgufWeightMix& mix) {
  const int64_t d = c.dim, hid = c.hidden_dim, q = c.q_dim(), kv = c.kv_dim(), V = c.vocab_size;
  auto sc = [](int64_t fan_in) { return 1.0f / std::sqrt(float(fan_in)); };
  std::vector<RandomTensorPlan> out;
  std::vector<int32_t> layer_of;
  AddTensor(&out, "token_embd.weight", {d, V}, 1.0f, false);
  layer_of.push_back(-1);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const std::string b = absl::StrCat("blk.", l, ".");
    AddTensor(&out, b + "attn_norm.weight", {d}, 1.0f, true);
    AddTensor(&out, b + "attn_q.weight", {d, q}, sc(d), false);
    AddTensor(&out, b + "attn_k.weight", {d, kv}, sc(d), false);
    AddTensor(&out, b + "attn_v.weight", {d, kv}, sc(d), false);
    if (c.attention_bias) {
      AddTensor(&out, b + "attn_q.bias", {q}, kBiasScale, false);
      AddTensor(&out, b + "attn_k.bias", {kv}, kBiasScale, false);
      AddTensor(&out, b + "attn_v.bias", {kv}, kBiasScale, false);
    }
    if (c.qk_norm) {
      AddTensor(&out, b + "attn_q_norm.weight", {c.head_dim()}, 1.0f, true);
      AddTensor(&out, b + "attn_k_norm.weight", {c.head_dim()}, 1.0f, true);
    }
    AddTensor(&out, b + "attn_output.weight", {q, d}, sc(q), false);
    AddTensor(&out, b + "ffn_norm.weight", {d}, 1.0f, true);
    AddTensor(&out, b + "ffn_gate.weight", {d, hid}, sc(d), false);
    AddTensor(&out, b + "ffn_up.weight", {d, hid}, sc(d), false);
    AddTensor(&out, b + "ffn_down.weight", {hid, d}, sc(hid), false);
    layer_of.resize(out.size(), l);
  }
  AddTensor(&out, "output_norm.weight", {d}, 1.0f, true);
  if (!c.shared_classifier) AddTensor(&out, "output.weight", {d, V}, sc(d), false);
  layer_of.resize(out.size(), -1);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].type = GgufTensorType(
        mix, {out[i].name, out[i].dims, layer_of[i], c.num_layers, !c.shared_classifier});
  }
  return out;
}

void DrawRandomRow(const RandomTensorPlan& t, uint64_t seed, int64_t row, float* out) {
  const int64_t n = t.dims[0];
  if (t.constant) {
    std::fill(out, out + n, t.scale);
    return;
  }
  // xorshift64*, as WriteRandomModel, seeded per (seed, tensor, row).
  uint64_t s = SplitMix(SplitMix(seed) ^ SplitMix(NameHash(t.name)) ^ uint64_t(row));
  if (s == 0) s = 1;
  for (int64_t i = 0; i < n; ++i) {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    out[i] = t.scale * (float((s * 0x2545F4914F6CDD1Dull) >> 40) / float(1 << 23) - 1.0f);
  }
}

absl::StatusOr<ModelConfig> WriteRandomGgufModel(const RandomGgufOptions& o,
                                                 const std::string& path) {
  ModelConfig c = o.config;
  GgufWriter w;
  std::vector<const GgufMetadata*> vocab;
  absl::StatusOr<GgufFile> vocab_file = absl::NotFoundError("no vocabulary file");
  if (!o.vocab_from.empty()) {
    vocab_file = GgufFile::Open(o.vocab_from);
    if (!vocab_file.ok()) return vocab_file.status();
    const GgufMetadata* tokens = vocab_file->FindMetadata("tokenizer.ggml.tokens");
    if (tokens == nullptr || !tokens->is_array() || tokens->count == 0 ||
        tokens->count > uint64_t(INT32_MAX)) {
      return absl::InvalidArgumentError(
          absl::StrCat(o.vocab_from, ": no tokenizer.ggml.tokens array to take the vocabulary from"));
    }
    c.vocab_size = static_cast<int32_t>(tokens->count);
    for (const GgufMetadata& m : vocab_file->metadata()) {
      if (absl::StartsWith(m.key, "tokenizer.")) vocab.push_back(&m);
    }
  } else if (c.vocab_size < 259) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocabulary of ", c.vocab_size, " is too small for the minimal SentencePiece "
                     "vocabulary (3 special and 256 byte tokens); give --vocab 259 or more, or "
                     "--vocab-from FILE.gguf"));
  }
  if (absl::Status s = c.Validate(); !s.ok()) return s;

  AddModelMetadata(o, c, &w);
  if (vocab_file.ok()) {
    for (const GgufMetadata* m : vocab) w.AddMetadata(*m);
  } else {
    AddMinimalVocab(c.vocab_size, &w);
  }
  // GGML_QNT_VERSION, after the vocabulary as the converter writes it (for every file type).
  w.AddU32("general.quantization_version", 2);
  const std::vector<RandomTensorPlan> plan = PlanRandomGgufTensors(c, o.weights);
  int64_t total = 0, done = 0;
  for (const RandomTensorPlan& t : plan) {
    if (absl::Status s = w.AddTensorInfo(t.name, t.type, t.dims); !s.ok()) return s;
    total += *GgmlTensorBytes(t.type, t.dims);
  }
  absl::StatusOr<GgufStreamWriter> out = w.StartFile(path);
  if (!out.ok()) return out.status();
  std::vector<uint8_t> buf;
  for (const RandomTensorPlan& t : plan) {
    absl::StatusOr<cpu::QuantType> q = cpu::QuantTypeFromGgmlId(static_cast<uint32_t>(t.type));
    if (!q.ok()) return q.status();
    const int64_t cols = t.dims[0];
    int64_t rows = 1;
    for (size_t i = 1; i < t.dims.size(); ++i) rows *= t.dims[i];
    const int64_t row_bytes = cpu::QuantRowBytes(*q, cols);
    const int64_t chunk = std::max<int64_t>(1, kChunkElements / cols);
    for (int64_t r = 0; r < rows; r += chunk) {
      const int64_t n = std::min(chunk, rows - r);
      buf.resize(n * row_bytes);
      EncodeRows(t, o.seed, r, n, *q, row_bytes, buf.data());
      if (absl::Status s = out->Write(buf.data(), buf.size()); !s.ok()) return s;
      done += static_cast<int64_t>(buf.size());
      if (o.progress) o.progress(done, total);
    }
  }
  if (absl::Status s = out->Finish(); !s.ok()) return s;
  return c;
}

}  // namespace heavykv
