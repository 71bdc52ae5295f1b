#include "engine/gguf_writer.h"

#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace heavykv {
namespace {

template <typename T>
void Put(std::string* out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out->append(b, sizeof(T));
}

void PutString(std::string* out, absl::string_view s) {
  Put<uint64_t>(out, s.size());
  out->append(s.data(), s.size());
}

uint64_t Padding(uint64_t size, uint64_t alignment) {
  return (alignment - size % alignment) % alignment;
}

}  // namespace

GgufWriter::GgufWriter(uint64_t alignment) : alignment_(alignment) {
  if (alignment_ == 32) return;
  if (alignment_ <= UINT32_MAX) {
    AddU32("general.alignment", static_cast<uint32_t>(alignment_));
  } else {
    AddU64("general.alignment", alignment_);
  }
}

void GgufWriter::Key(absl::string_view key, GgufValueType type) {
  ++num_metadata_;
  PutString(&metadata_, key);
  Put<uint32_t>(&metadata_, static_cast<uint32_t>(type));
}

void GgufWriter::AddU8(absl::string_view key, uint8_t v) {
  Key(key, GgufValueType::kU8);
  Put(&metadata_, v);
}
void GgufWriter::AddI8(absl::string_view key, int8_t v) {
  Key(key, GgufValueType::kI8);
  Put(&metadata_, v);
}
void GgufWriter::AddU16(absl::string_view key, uint16_t v) {
  Key(key, GgufValueType::kU16);
  Put(&metadata_, v);
}
void GgufWriter::AddI16(absl::string_view key, int16_t v) {
  Key(key, GgufValueType::kI16);
  Put(&metadata_, v);
}
void GgufWriter::AddU32(absl::string_view key, uint32_t v) {
  Key(key, GgufValueType::kU32);
  Put(&metadata_, v);
}
void GgufWriter::AddI32(absl::string_view key, int32_t v) {
  Key(key, GgufValueType::kI32);
  Put(&metadata_, v);
}
void GgufWriter::AddU64(absl::string_view key, uint64_t v) {
  Key(key, GgufValueType::kU64);
  Put(&metadata_, v);
}
void GgufWriter::AddI64(absl::string_view key, int64_t v) {
  Key(key, GgufValueType::kI64);
  Put(&metadata_, v);
}
void GgufWriter::AddF32(absl::string_view key, float v) {
  Key(key, GgufValueType::kF32);
  Put(&metadata_, v);
}
void GgufWriter::AddF64(absl::string_view key, double v) {
  Key(key, GgufValueType::kF64);
  Put(&metadata_, v);
}
void GgufWriter::AddBool(absl::string_view key, bool v) {
  Key(key, GgufValueType::kBool);
  Put<uint8_t>(&metadata_, v ? 1 : 0);
}
void GgufWriter::AddString(absl::string_view key, absl::string_view v) {
  Key(key, GgufValueType::kString);
  PutString(&metadata_, v);
}

void GgufWriter::AddArray(absl::string_view key, GgufValueType element_type, uint64_t count,
                          absl::string_view elements) {
  Key(key, GgufValueType::kArray);
  Put<uint32_t>(&metadata_, static_cast<uint32_t>(element_type));
  Put<uint64_t>(&metadata_, count);
  metadata_.append(elements.data(), elements.size());
}

void GgufWriter::AddArrayI32(absl::string_view key, const std::vector<int32_t>& v) {
  AddArray(key, GgufValueType::kI32, v.size(),
           {reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int32_t)});
}

void GgufWriter::AddArrayF32(absl::string_view key, const std::vector<float>& v) {
  AddArray(key, GgufValueType::kF32, v.size(),
           {reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)});
}

void GgufWriter::AddArrayString(absl::string_view key, const std::vector<std::string>& v) {
  Key(key, GgufValueType::kArray);
  Put<uint32_t>(&metadata_, static_cast<uint32_t>(GgufValueType::kString));
  Put<uint64_t>(&metadata_, v.size());
  for (const std::string& s : v) PutString(&metadata_, s);
}

absl::Status GgufWriter::AddTensor(absl::string_view name, GgmlType type, std::vector<int64_t> dims,
                                   std::string data) {
  if (dims.empty() || dims.size() > 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "': ", dims.size(), " dimensions, not 1..4"));
  }
  absl::StatusOr<int64_t> bytes = GgmlTensorBytes(type, dims);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "': ", bytes.status().message()));
  }
  if (static_cast<uint64_t>(*bytes) != data.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "': ", data.size(), " bytes given, its type and shape need ", *bytes));
  }
  const uint64_t offset = data_bytes_;
  data_bytes_ += data.size() + Padding(data.size(), alignment_);
  tensors_.push_back({std::string(name), type, std::move(dims), std::move(data), offset});
  return absl::OkStatus();
}

// Everything before the data section, padding included.
std::string GgufWriter::Header() const {
  std::string out;
  out.append("GGUF", 4);
  Put<uint32_t>(&out, version_);
  Put<uint64_t>(&out, tensors_.size());
  Put<uint64_t>(&out, num_metadata_);
  out.append(metadata_);
  for (const Tensor& t : tensors_) {
    PutString(&out, t.name);
    Put<uint32_t>(&out, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) Put<uint64_t>(&out, static_cast<uint64_t>(d));
    Put<uint32_t>(&out, static_cast<uint32_t>(t.type));
    Put<uint64_t>(&out, t.offset);
  }
  out.append(Padding(out.size(), alignment_), '\0');
  return out;
}

std::string GgufWriter::Serialize() const {
  std::string out = Header();
  for (const Tensor& t : tensors_) {
    out.append(t.data);
    out.append(Padding(t.data.size(), alignment_), '\0');
  }
  return out;
}

absl::Status GgufWriter::WriteFile(const std::string& path) const {
  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, Closer> f(std::fopen(path.c_str(), "wb"));
  if (f == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot create the file"));
  }
  const std::string zeros(alignment_, '\0');
  auto write = [&](const char* p, size_t n) {
    return n == 0 || std::fwrite(p, 1, n, f.get()) == n;
  };
  const std::string header = Header();
  bool ok = write(header.data(), header.size());
  for (const Tensor& t : tensors_) {
    ok = ok && write(t.data.data(), t.data.size()) &&
         write(zeros.data(), Padding(t.data.size(), alignment_));
  }
  if (std::fclose(f.release()) != 0) ok = false;
  if (!ok) return absl::InvalidArgumentError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace heavykv
