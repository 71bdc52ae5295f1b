// Fuzzes the GGUF reader (engine/gguf/gguf.h): the input is the file. GgufFile::Open must return a
// status for any bytes, never crash, overflow, hang or allocate what the file size does not back;
// an accepted file must keep its promises: every tensor's bytes inside the file, every metadata
// value readable, and a copy written with GgufWriter must open again with the same contents.
// A file the model loader accepts (engine/model/gguf_model.h) must give a model that agrees with
// its configuration and runs a step of two tokens (small models only: the fuzzer stays fast).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/gguf/gguf.h"
#include "engine/model/gguf_model.h"
#include "engine/model/gguf_support.h"
#include "engine/runner/model_runner.h"
#include "engine/gguf/gguf_writer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using heavykv::GgufFile;
using heavykv::GgufMetadata;
using heavykv::GgufTensor;
using heavykv::GgufValueType;

// Adds `m` to `w` as it is.
void Copy(const GgufMetadata& m, heavykv::GgufWriter* w) {
  const std::string raw(reinterpret_cast<const char*>(m.raw.data()), m.raw.size());
  if (!m.is_array()) {
    const heavykv::GgufScalar v = m.Value();
    switch (m.type) {
      case GgufValueType::kString:
        w->AddString(m.key, raw);
        return;
      case GgufValueType::kBool:
        w->AddBool(m.key, std::get<bool>(v));
        return;
      case GgufValueType::kU8:
        w->AddU8(m.key, uint8_t(std::get<uint64_t>(v)));
        return;
      case GgufValueType::kI8:
        w->AddI8(m.key, int8_t(std::get<int64_t>(v)));
        return;
      case GgufValueType::kU16:
        w->AddU16(m.key, uint16_t(std::get<uint64_t>(v)));
        return;
      case GgufValueType::kI16:
        w->AddI16(m.key, int16_t(std::get<int64_t>(v)));
        return;
      case GgufValueType::kU32:
        w->AddU32(m.key, uint32_t(std::get<uint64_t>(v)));
        return;
      case GgufValueType::kI32:
        w->AddI32(m.key, int32_t(std::get<int64_t>(v)));
        return;
      case GgufValueType::kU64:
        w->AddU64(m.key, std::get<uint64_t>(v));
        return;
      case GgufValueType::kI64:
        w->AddI64(m.key, std::get<int64_t>(v));
        return;
      case GgufValueType::kF32:
        w->AddF32(m.key, float(std::get<double>(v)));
        return;
      case GgufValueType::kF64:
        w->AddF64(m.key, std::get<double>(v));
        return;
      case GgufValueType::kArray:
        break;
    }
    heavykv::fuzz::Die("a scalar of an unknown type was accepted");
  }
  if (m.element_type == GgufValueType::kString) {
    std::vector<std::string> strings;
    for (uint64_t i = 0, at = 0; i < m.count; ++i) {
      uint64_t len;
      std::memcpy(&len, m.raw.data() + at, 8);
      strings.push_back(raw.substr(at + 8, len));
      at += 8 + len;
    }
    w->AddArrayString(m.key, strings);
  } else {
    w->AddArray(m.key, m.element_type, m.count, raw);
  }
}

// Loads the model of an accepted file, if the loader takes it, and runs one step.
void CheckModel(const GgufFile& f) {
  absl::StatusOr<heavykv::ModelConfig> config = heavykv::ReadGgufModelConfig(f);
  if (!config.ok() || config->NumParams() > (int64_t(1) << 22)) return;
  absl::StatusOr<heavykv::Model> model = heavykv::LoadGgufModel(f, heavykv::cpu::WeightType::kFp32);
  if (!model.ok()) return;
  const heavykv::ModelConfig& c = model->config;
  if (c.dim != config->dim || c.vocab_size != config->vocab_size ||
      static_cast<int64_t>(model->layers.size()) != c.num_layers ||
      model->classifier.rows() != c.vocab_size || model->classifier.cols() != c.dim ||
      model->layers[0].wqkv.rows() != c.qkv_dim() || model->layers[0].wo.cols() != c.q_dim()) {
    heavykv::fuzz::Die("an accepted GGUF model disagrees with its configuration");
  }
  heavykv::KvShape shape = heavykv::KvShapeFor(c, 16);
  absl::StatusOr<std::unique_ptr<heavykv::KvCache>> cache = heavykv::KvCache::Create(shape, 4 * shape.NumTables());
  if (!cache.ok()) heavykv::fuzz::Die("no KV cache for an accepted model");
  heavykv::ModelRunner runner(*model, cache->get());
  heavykv::SequenceKv kv;
  const std::vector<int32_t> tokens = {0, c.vocab_size - 1};
  heavykv::SequenceStep step{&kv, tokens, 0, true};
  absl::StatusOr<std::span<const float>> logits = runner.Forward({&step, 1});
  if (c.seq_len >= 2 && !logits.ok()) {
    heavykv::fuzz::Die("an accepted model cannot run two tokens: " +
                       std::string(logits.status().message()));
  }
  if (logits.ok() && logits->size() != size_t(2) * c.vocab_size) {
    heavykv::fuzz::Die("a step returned the wrong number of logits");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const heavykv::fuzz::ScratchFile* file =
      new heavykv::fuzz::ScratchFile("heavykv_gguf_fuzz");
  static const heavykv::fuzz::ScratchFile* copy =
      new heavykv::fuzz::ScratchFile("heavykv_gguf_copy");
  absl::StatusOr<GgufFile> f = GgufFile::Open(file->Write(data, size));
  if (!f.ok()) {
    if (f.status().code() != absl::StatusCode::kInvalidArgument) {
      heavykv::fuzz::Die("Open failed with a code other than INVALID_ARGUMENT");
    }
    return 0;
  }
  (void)heavykv::CheckGgufSupported(*f);
  CheckModel(*f);
  // The writer pads its header to the alignment: copy only files it can write in little memory.
  if (f->alignment() > 4096) return 0;
  heavykv::GgufWriter w(f->alignment());
  for (const GgufMetadata& m : f->metadata()) {
    if (m.key != "general.alignment") Copy(m, &w);  // the writer adds it for its alignment
  }
  uint64_t tensor_bytes = 0;
  for (const GgufTensor& t : f->tensors()) {
    tensor_bytes += t.data.size();
    if (t.offset % f->alignment() != 0) heavykv::fuzz::Die("accepted a misaligned tensor");
    const std::string bytes(reinterpret_cast<const char*>(t.data.data()), t.data.size());
    const std::vector<int64_t> dims(t.shape().begin(), t.shape().end());
    if (!w.AddTensor(t.name, t.type, dims, bytes).ok()) {
      heavykv::fuzz::Die("an accepted tensor's size disagrees with its type and shape");
    }
  }
  if (tensor_bytes > f->file_size() - f->data_offset()) {
    heavykv::fuzz::Die("accepted tensors larger than the data section");
  }
  const std::string rewritten = w.Serialize();
  absl::StatusOr<GgufFile> g = GgufFile::Open(
      copy->Write(reinterpret_cast<const uint8_t*>(rewritten.data()), rewritten.size()));
  if (!g.ok())
    heavykv::fuzz::Die("a rewritten accepted file does not open: " +
                       std::string(g.status().message()));
  // general.alignment is written by the writer, only when it is not the default.
  const size_t keys = f->metadata().size() - (f->FindMetadata("general.alignment") ? 1 : 0) +
                      (f->alignment() != 32 ? 1 : 0);
  if (g->metadata().size() != keys || g->tensors().size() != f->tensors().size()) {
    heavykv::fuzz::Die("a rewritten accepted file lost keys or tensors");
  }
  return 0;
}
