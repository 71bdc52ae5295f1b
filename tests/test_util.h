// Paths and fixtures shared by the tests: the bundled model, and small random-weight models the
// project writes itself (make-model's code path) for shapes the bundled model does not cover.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/model/make_model.h"
#include "engine/model/model.h"
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

// The whole file, bytes as they are ("" when it cannot be read).
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The stdout of a shell command; its wait status in *code when given.
inline std::string RunCapture(const std::string& cmd, int* code = nullptr) {
  std::string out;
  std::FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    if (code != nullptr) *code = -1;
    return out;
  }
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  if (code != nullptr) *code = status;
  return out;
}

// y[m][n] = x[m][k] w[n][k]^T (+ y0 when not empty), in double: the reference of the GEMM tests.
inline std::vector<double> ReferenceMatmul(const std::vector<float>& x, const std::vector<float>& w,
                                           const std::vector<float>& y0, int64_t m, int64_t n,
                                           int64_t k) {
  std::vector<double> y(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = y0.empty() ? 0.0 : y0[i * n + j];
      for (int64_t d = 0; d < k; ++d) acc += double(x[i * k + d]) * w[j * k + d];
      y[i * n + j] = acc;
    }
  }
  return y;
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
