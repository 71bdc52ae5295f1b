// TEST HELPER ONLY, to be replaced by engine/gguf.h (the GGUF reader, issue 14) once it exists:
// walks a GGUF file's header just far enough to list its tensors (name, shape, ggml type, bytes)
// so that tests/quant_test.cc can read the fixtures in /work/shared/gguf. Trusts its input (test
// fixtures), checks only what keeps it from reading out of bounds, and skips every metadata value.
//
// Layout (GGUF v2/v3, little-endian): "GGUF", u32 version, u64 tensor count, u64 kv count; kvs
// (string key, u32 value type, value); tensor infos (string name, u32 n_dims, u64 dims[n_dims]
// (dims[0] = the row length), u32 ggml type, u64 offset into the data); the data, starting at the
// next multiple of general.alignment (default 32). Strings are u64 length + bytes.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

namespace heavykv::testing {

struct GgufTestTensor {
  std::string name;
  std::vector<int64_t> dims;  // dims[0]: elements per row
  uint32_t type = 0;          // ggml type id
  const uint8_t* data = nullptr;
  int64_t rows() const {
    int64_t r = 1;
    for (size_t i = 1; i < dims.size(); ++i) r *= dims[i];
    return r;
  }
};

class GgufTestFile {
 public:
  // Reads the whole file; ok() is false when it cannot be read or parsed.
  explicit GgufTestFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    bytes_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    ok_ = !bytes_.empty() && Parse();
  }
  bool ok() const { return ok_; }
  const std::map<std::string, GgufTestTensor>& tensors() const { return tensors_; }

 private:
  template <typename T>
  T Read() {
    T v{};
    if (pos_ + sizeof(T) > bytes_.size()) {
      bad_ = true;
      return v;
    }
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string ReadString() {
    const uint64_t n = Read<uint64_t>();
    if (bad_ || pos_ + n > bytes_.size()) {
      bad_ = true;
      return {};
    }
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  // Skips one value of GGUF value type `t`; returns it when it is an integer (for alignment).
  uint64_t SkipValue(uint32_t t) {
    static constexpr int kSizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (t == 8) {
      ReadString();
      return 0;
    }
    if (t == 9) {
      const uint32_t et = Read<uint32_t>();
      const uint64_t count = Read<uint64_t>();
      for (uint64_t i = 0; i < count && !bad_; ++i) SkipValue(et);
      return 0;
    }
    if (t > 12) {
      bad_ = true;
      return 0;
    }
    uint64_t v = 0;
    if (pos_ + kSizes[t] > bytes_.size()) {
      bad_ = true;
      return 0;
    }
    std::memcpy(&v, bytes_.data() + pos_, kSizes[t]);
    pos_ += kSizes[t];
    return v;
  }
  bool Parse() {
    if (bytes_.size() < 24 || std::memcmp(bytes_.data(), "GGUF", 4) != 0) return false;
    pos_ = 4;
    const uint32_t version = Read<uint32_t>();
    if (version < 2) return false;
    const uint64_t num_tensors = Read<uint64_t>(), num_kvs = Read<uint64_t>();
    uint64_t alignment = 32;
    for (uint64_t i = 0; i < num_kvs && !bad_; ++i) {
      const std::string key = ReadString();
      const uint64_t v = SkipValue(Read<uint32_t>());
      if (key == "general.alignment") alignment = v;
    }
    std::vector<std::pair<GgufTestTensor, uint64_t>> infos;
    for (uint64_t i = 0; i < num_tensors && !bad_; ++i) {
      GgufTestTensor t;
      t.name = ReadString();
      const uint32_t n_dims = Read<uint32_t>();
      for (uint32_t d = 0; d < n_dims && !bad_; ++d) t.dims.push_back(Read<int64_t>());
      t.type = Read<uint32_t>();
      infos.emplace_back(t, Read<uint64_t>());
    }
    if (bad_ || alignment == 0) return false;
    const uint64_t data_start = (pos_ + alignment - 1) / alignment * alignment;
    for (auto& [t, offset] : infos) {
      if (data_start + offset > bytes_.size()) return false;
      t.data = bytes_.data() + data_start + offset;
      tensors_[t.name] = t;
    }
    return true;
  }

  std::vector<uint8_t> bytes_;
  size_t pos_ = 0;
  bool bad_ = false, ok_ = false;
  std::map<std::string, GgufTestTensor> tensors_;
};

}  // namespace heavykv::testing
