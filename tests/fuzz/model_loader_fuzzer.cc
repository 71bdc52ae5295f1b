// Fuzzes the llama2.c checkpoint loader (engine/model/model.h): the input is the checkpoint file.
// LoadModel and ReadModelConfig must return a status for any bytes, never crash, overflow or
// allocate what the file size does not back; an accepted model must agree with its header.
#include <cstddef>
#include <cstdint>

#include "engine/model/model.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const heavykv::fuzz::ScratchFile* file =
      new heavykv::fuzz::ScratchFile("heavykv_model_fuzz");
  const std::string& path = file->Write(data, size);
  absl::StatusOr<heavykv::ModelConfig> config = heavykv::ReadModelConfig(path);
  for (heavykv::cpu::WeightType w : {heavykv::cpu::WeightType::kFp32,
                                     heavykv::cpu::WeightType::kBf16}) {
    absl::StatusOr<heavykv::Model> model = heavykv::LoadModel(path, w);
    if (!model.ok()) continue;
    const heavykv::ModelConfig& c = model->config;
    if (!config.ok() || c.dim != config->dim || c.vocab_size != config->vocab_size ||
        static_cast<int64_t>(model->layers.size()) != c.num_layers ||
        model->classifier.rows() != c.vocab_size || model->classifier.cols() != c.dim) {
      heavykv::fuzz::Die("an accepted model disagrees with its header");
    }
    std::vector<float> row(c.dim);
    model->EmbedToken(c.vocab_size - 1, row.data());
  }
  return 0;
}
