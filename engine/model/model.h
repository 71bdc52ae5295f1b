// Model: a Llama-family transformer's configuration and fp32 weights, loaded from a llama2.c
// checkpoint (header of seven int32, then fp32 tensors) or a GGUF file (engine/model/gguf_model.h;
// told apart by the GGUF magic) into a layout fused for batched GEMMs.
//
// Checkpoint: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len; a positive
// vocab_size means the classifier shares the token embedding, a negative one that a separate
// classifier follows the RoPE tables. n_kv_heads < n_heads is grouped-query attention.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/aligned_vector.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/packed_matrix.h"

namespace heavykv {

// The transformer variant: what the layers compute besides the Llama block (GGUF
// general.architecture). kLlama covers Llama 1/2/3.x, Mistral, TinyLlama, SmolLM.
enum class Architecture {
  kLlama,
  kQwen2,  // q/k/v biases
  kQwen3,  // per-head RMSNorm of q and k before rope; head size from key_length
};
const char* ArchitectureName(Architecture a);
// "llama", "qwen2", "qwen3" (ArchitectureName's names); INVALID_ARGUMENT listing them.
absl::StatusOr<Architecture> ParseArchitecture(absl::string_view name);

// How rope pairs the entries of a head of size hd. kInterleaved (llama.cpp's NORM, run.c) rotates
// (2i, 2i+1); kNeox (Qwen, GPT-NeoX, Hugging Face's rotate_half) rotates (i, i + hd/2). Both use
// frequency theta^(-2i/hd) (times a per-pair factor where rope_freqs.weight gives one).
enum class RopeStyle { kInterleaved, kNeox };

struct ModelConfig {
  int32_t dim = 0;
  int32_t hidden_dim = 0;
  int32_t num_layers = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t vocab_size = 0;
  int32_t seq_len = 0;
  bool shared_classifier = true;
  // llama2.c's fixed values; a GGUF file gives its own (llama.rope.freq_base,
  // llama.attention.layer_norm_rms_epsilon).
  float rope_theta = 10000.0f;
  float rms_norm_eps = 1e-5f;
  Architecture arch = Architecture::kLlama;
  RopeStyle rope_style = RopeStyle::kInterleaved;
  // Size of a query / key / value head; 0 means dim / num_heads (every llama2.c checkpoint and
  // most GGUF files). Qwen3 heads are wider (attention.key_length 128 at dim 1024 / 16 heads).
  int32_t head_size = 0;
  bool attention_bias = false;  // q/k/v projections add a bias (Qwen2)
  bool qk_norm = false;         // per-head RMSNorm of q and k before rope (Qwen3)
  // Llama 3.1 rope scaling: the Model carries head_dim/2 frequency divisors (rope_freqs.weight).
  bool rope_freq_factors = false;
  // Special tokens: llama2.c's 1 and 2; a GGUF file's tokenizer.ggml.bos_token_id /
  // eos_token_id. A prompt of ids gets BOS in front unless it starts with it or add_bos is false
  // (tokenizer.ggml.add_bos_token; Qwen files say false); generation ends at EOS (or BOS, as
  // run.c does).
  int32_t bos_id = 1;
  int32_t eos_id = 2;
  bool add_bos = true;

  int32_t head_dim() const { return head_size > 0 ? head_size : dim / num_heads; }
  int32_t q_dim() const { return num_heads * head_dim(); }  // == dim unless head_size says not
  int32_t kv_dim() const { return num_kv_heads * head_dim(); }
  int32_t group_size() const { return num_heads / num_kv_heads; }  // query heads per kv head
  int32_t qkv_dim() const { return q_dim() + 2 * kv_dim(); }
  // Parameters as stored in the checkpoint (without the RoPE tables); defined when Validate() is
  // ok.
  int64_t NumParams() const;
  // OK when every field is positive, the heads split dim evenly, and the sizes derived from the
  // fields fit their types (qkv_dim() in int32, the checkpoint's byte count in int64); else
  // INVALID_ARGUMENT naming the field.
  absl::Status Validate() const;
};

// Sets the architecture and what it implies: rope style (NEOX for Qwen), q/k/v biases (qwen2),
// q/k norms (qwen3). Sizes, rope theta and epsilon stay.
void SetArchitecture(Architecture arch, ModelConfig* c);
// A prompt of ids as the model takes it: `ids` with c.bos_id in front unless they already start
// with it or c.add_bos is false.
std::vector<int32_t> PromptWithBos(const ModelConfig& c, std::span<const int32_t> ids);

// Weights in the fused layout the runner multiplies with. Each matrix is [out][in], held once as
// a cpu::Linear (kernels/cpu/linear.h): fp32 or bf16 panels packed for the CPU GEMM
// (llama2.c checkpoints, F32/F16/BF16 GGUF tensors), or a GGUF block format kept as the file
// stores it (Q8_0, Q4_K, ...; a fused matrix of mixed types is several parts). A backend that
// wants row-major data (e.g. to upload it) reads it back with Linear::ToRowMajor / Row.
struct LayerWeights {
  AlignedVector<float> rms_att;  // [dim]
  cpu::Linear wqkv;              // [q_dim + 2*kv_dim][dim]: rows of wq, then wk, then wv
  AlignedVector<float> bqkv;     // [q_dim + 2*kv_dim] q/k/v biases (Qwen2); empty: none
  AlignedVector<float> q_norm;   // [head_dim] per-head RMSNorm weights of q (Qwen3); empty: none
  AlignedVector<float> k_norm;   // [head_dim] the same for k
  cpu::Linear wo;                // [dim][q_dim]
  AlignedVector<float> rms_ffn;  // [dim]
  cpu::Linear w13;               // [2*hidden][dim]: rows of w1 (gate), then w3 (up)
  cpu::Linear w2;                // [dim][hidden]
};

struct Model {
  ModelConfig config;
  std::vector<LayerWeights> layers;
  AlignedVector<float> rms_final;  // [dim]
  cpu::Linear classifier;          // [vocab][dim]; the token embedding too when shared
  // [vocab][dim] token embedding; empty when shared with the classifier (then rows are read
  // back from `classifier`). Use EmbedToken().
  cpu::Linear embedding;
  // [head_dim / 2] rope frequency divisors (config.rope_freq_factors; Llama 3.1); else empty.
  AlignedVector<float> rope_freqs;

  // out[dim] = embedding row of `token` (0 <= token < vocab_size).
  void EmbedToken(int32_t token, float* out) const;
  // Bytes of weights a decode step reads (every matrix once, the classifier once).
  int64_t WeightBytes() const;
  // Bytes the model holds: WeightBytes() plus a separate embedding and the rope factors.
  int64_t HeldBytes() const;
};

// Loads a llama2.c checkpoint, or a GGUF file (LoadGgufModel) when the file starts with the GGUF
// magic. NOT_FOUND if it cannot be opened; INVALID_ARGUMENT with the
// reason if the header is inconsistent or the file size does not match the header.
// `weights` kBf16 packs every matrix as bf16 (--weight-dtype bf16: half the memory and the
// bytes a step streams; the GEMM widens to fp32); norms and a separate embedding stay fp32.
// --weight-dtype: "auto" or "fp32" (the checkpoint's own precision, what the greedy and eval
// tests pin) or "bf16"; INVALID_ARGUMENT otherwise.
absl::StatusOr<cpu::WeightType> ParseWeightDtype(absl::string_view name);
absl::StatusOr<Model> LoadModel(const std::string& path,
                                cpu::WeightType weights = cpu::WeightType::kFp32);
// Reads only the header (a GGUF file: its metadata and tensor shapes, no weights).
absl::StatusOr<ModelConfig> ReadModelConfig(const std::string& path);

}  // namespace heavykv
