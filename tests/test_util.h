// Paths and fixtures shared by the tests: the bundled model, and small random-weight models the
// project writes itself (make-model's code path) for shapes the bundled model does not cover.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include <vector>

#include "engine/make_model.h"
#include "engine/model.h"
#include "kernels/cpu/isa.h"

namespace heavykv::testing {

// Every ISA path this CPU runs, for tests that check each against one reference; the others are
// named on stdout, so a log shows which paths a machine could not test.
inline std::vector<cpu::Isa> IsasToTest() {
  for (cpu::Isa isa : cpu::kAllIsas) {
    if (!cpu::IsaSupported(isa)) {
      std::printf("[ note ] this CPU has no %s: that path is not tested here\n", cpu::IsaName(isa));
    }
  }
  return cpu::SupportedIsas();
}

inline std::string SourcePath(const std::string& rel) {
  return std::string(HEAVYKV_SOURCE_DIR) + "/" + rel;
}
inline std::string ModelPath() { return SourcePath("models/stories260K.bin"); }
inline std::string TokenizerPath() { return SourcePath("models/tok512.bin"); }

// A fresh directory under the system temp dir, removed by the destructor.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "heavykv-test-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A small GQA configuration (4 query heads per kv head) with a separate classifier.
inline ModelConfig SmallGqaConfig() {
  ModelConfig c;
  c.dim = 64;
  c.hidden_dim = 96;
  c.num_layers = 3;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.vocab_size = 300;
  c.seq_len = 256;
  c.shared_classifier = false;
  return c;
}

}  // namespace heavykv::testing
