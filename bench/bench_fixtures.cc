#include "bench/bench_fixtures.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "engine/gguf/gguf_weight_mix.h"
#include "engine/model/make_gguf_model.h"
#include "engine/model/make_model.h"

namespace heavykv::bench {
namespace {

std::string& ScratchDir() {
  static std::string dir = "/tmp/heavykv-bench";
  return dir;
}

}  // namespace

void Die(const absl::Status& s) {
  std::fprintf(stderr, "bench: %s\n", std::string(s.message()).c_str());
  std::exit(1);
}

void SetScratchDir(const std::string& dir) { ScratchDir() = dir; }

std::string BenchFilePath(const std::string& file) {
  std::filesystem::create_directories(ScratchDir());
  return ScratchDir() + "/" + file;
}

std::string GgufBenchModelPath(const std::string& shape, const std::string& mix) {
  return BenchFilePath(shape + "-" + mix + ".gguf");
}

std::string Llama1bFile(const std::string& mix) {
  const std::string path = GgufBenchModelPath("llama3.2-1b", mix);
  if (std::filesystem::exists(path)) return path;
  RandomGgufOptions o;
  o.config = *NamedShape("llama3.2-1b");
  absl::StatusOr<GgufWeightMix> w = ParseGgufWeightMix(mix);
  if (!w.ok()) Die(w.status());
  o.weights = *w;
  std::fprintf(stderr, "bench: writing %s\n", path.c_str());
  absl::StatusOr<ModelConfig> c = WriteRandomGgufModel(o, path + ".tmp");
  if (!c.ok()) Die(c.status());
  std::filesystem::rename(path + ".tmp", path);
  return path;
}

const std::string& Stories110MPath() {
  static const std::string* path = [] {
    ModelConfig c = *NamedShape("stories110M");
    c.seq_len = 4608;  // room for 4096 cached tokens plus the benchmark's decode steps
    std::filesystem::create_directories(ScratchDir());
    auto* p = new std::string(ScratchDir() + "/stories110M-4608.bin");
    absl::StatusOr<ModelConfig> have = ReadModelConfig(*p);
    if (!have.ok() || have->seq_len != c.seq_len) {
      if (absl::Status s = WriteRandomModel(c, 1, *p); !s.ok()) Die(s);
    }
    return p;
  }();
  return *path;
}

const Model& Stories110M(cpu::WeightType weights) {
  auto load = [](cpu::WeightType w) {
    absl::StatusOr<Model> m = LoadModel(Stories110MPath(), w);
    if (!m.ok()) Die(m.status());
    return new Model(*std::move(m));
  };
  if (weights == cpu::WeightType::kBf16) {
    static const Model* bf16 = load(cpu::WeightType::kBf16);
    return *bf16;
  }
  static const Model* fp32 = load(cpu::WeightType::kFp32);
  return *fp32;
}

Model SmallModel(const ModelConfig& c, const std::string& file, uint64_t seed) {
  const std::string path = BenchFilePath(file);
  if (!std::filesystem::exists(path)) {
    if (absl::Status s = WriteRandomModel(c, seed, path); !s.ok()) Die(s);
  }
  absl::StatusOr<Model> model = LoadModel(path);
  if (!model.ok()) Die(model.status());
  return *std::move(model);
}

double DecodeFlopsPerToken(const ModelConfig& c, int64_t context) {
  const double d = c.dim, hid = c.hidden_dim, kv = c.kv_dim();
  const double matmul = c.num_layers * (d * (d + 2 * kv) + d * d + 3 * d * hid) +
                        double(c.vocab_size) * d;
  const double attention = c.num_layers * 4.0 * double(context) * d;  // q.k and p.v per head
  return 2 * matmul + attention;
}

double KvBytesPerToken(const ModelConfig& c, int64_t context) {
  return double(context) * c.num_layers * c.kv_dim() * 2 * sizeof(float);
}

std::unique_ptr<Batch> MakeBatch(const Model& model, int32_t batch, int32_t context,
                                 const std::string& policy, int32_t budget,
                                 int32_t kv_element_bytes, bool table_per_layer) {
  auto b = std::make_unique<Batch>();
  KvShape shape = KvShapeFor(model.config, 16);
  shape.element_bytes = kv_element_bytes;
  shape.table_per_layer = table_per_layer;
  std::unique_ptr<EvictionPolicy> probe = policy == "full" ? nullptr : *MakePolicy(policy);
  // Each sequence's peak (PeakPages: per layer its budget + 1, or the context + 1) and a page of
  // slack per layer.
  const int64_t pages =
      batch * (PeakPages(shape, probe.get(), budget, context + 1) + shape.NumTables());
  b->cache = *KvCache::Create(shape, static_cast<int32_t>(pages));
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  b->seqs.resize(batch);
  for (int32_t i = 0; i < batch; ++i) {
    SequenceKv& s = b->seqs[i];
    if (policy != "full") {
      b->policies.push_back(*MakePolicy(policy));
      s.policy = b->policies.back().get();
      s.budget = budget;
    }
    // Pyramid's first layers keep more than `budget`: fill the whole context and let each layer
    // keep its newest min(context, b_l) (CommitStep drops the slots past that).
    const bool pyramid = s.policy != nullptr && s.policy->layer_budgets() == LayerBudgets::kPyramid;
    const int32_t fill = pyramid ? context : std::min(context, budget);
    if (absl::Status st = b->cache->Reserve(s, fill); !st.ok()) Die(st);
    for (int32_t l = 0; l < shape.num_layers; ++l) {
      const int32_t kept = std::min(fill, s.LayerBudget(l));
      for (int32_t h = 0; h < shape.num_kv_heads; ++h) {
        PagedKvHead v = b->cache->View(s, l, h, fill);
        std::vector<float> k(shape.head_dim), val(shape.head_dim);
        for (int32_t slot = 0; slot < kept; ++slot) {
          for (int32_t d = 0; d < shape.head_dim; ++d) {
            k[d] = normal(rng);
            val[d] = normal(rng);
          }
          v.StoreRows(slot, k.data(), val.data());
          v.Pos(slot) = context - kept + slot;
          v.Score(slot) = uniform(rng);
        }
      }
    }
    b->cache->CommitStep(s, fill);
    b->tokens.push_back(3 + i);
  }
  b->next_pos = context;
  return b;
}

void Prefill(ModelRunner& runner, SequenceKv& kv, std::span<const int32_t> prompt,
             int32_t chunk) {
  const int32_t tokens = static_cast<int32_t>(prompt.size());
  for (int32_t t0 = 0; t0 < tokens; t0 += chunk) {
    SequenceStep step{&kv, prompt.subspan(t0, std::min(chunk, tokens - t0)), t0, false};
    if (absl::StatusOr<std::span<const float>> r = runner.Forward({&step, 1}); !r.ok()) {
      Die(r.status());
    }
  }
}

void DecodeStep(ModelRunner& runner, Batch& b, int32_t context) {
  const int32_t seq_len = runner.model().config.seq_len;
  if (b.next_pos >= seq_len) b.next_pos = context;  // positions wrap; the context stays fixed
  std::vector<SequenceStep> steps(b.seqs.size());
  for (size_t i = 0; i < b.seqs.size(); ++i) {
    steps[i] = SequenceStep{&b.seqs[i], {&b.tokens[i], 1}, b.next_pos, false};
  }
  absl::StatusOr<std::span<const float>> r = runner.Forward(steps);
  if (!r.ok()) Die(r.status());
  for (SequenceKv& s : b.seqs) {
    if (s.policy == nullptr) b.cache->Truncate(s, s.Slots(0) - 1);
  }
  ++b.next_pos;
}

std::vector<int32_t> SyntheticTokenIds(int32_t n, int32_t salt) {
  std::vector<int32_t> v;
  for (int32_t i = 0; i < n; ++i) v.push_back(100 + (salt * 7919 + i * 131) % 30000);
  return v;
}

}  // namespace heavykv::bench
