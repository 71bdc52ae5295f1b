#include "engine/gguf/gguf_writer.h"

#include <algorithm>
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

void GgufWriter::AddMetadata(const GgufMetadata& m) {
  const absl::string_view raw(reinterpret_cast<const char*>(m.raw.data()), m.raw.size());
  if (m.type == GgufValueType::kString) {
    AddString(m.key, raw);
  } else if (m.is_array()) {
    AddArray(m.key, m.element_type, m.count, raw);  // string elements keep their length prefixes
  } else {
    Key(m.key, m.type);
    metadata_.append(raw.data(), raw.size());
  }
}

absl::Status GgufWriter::AddTensor(absl::string_view name, GgmlType type, std::vector<int64_t> dims,
                                   std::string data) {
  return PushTensor(name, type, std::move(dims), std::move(data), true);
}

absl::Status GgufWriter::AddTensorInfo(absl::string_view name, GgmlType type,
                                       std::vector<int64_t> dims) {
  return PushTensor(name, type, std::move(dims), std::string(), false);
}

absl::Status GgufWriter::PushTensor(absl::string_view name, GgmlType type,
                                    std::vector<int64_t> dims, std::string data, bool has_data) {
  if (dims.empty() || dims.size() > 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "': ", dims.size(), " dimensions, not 1..4"));
  }
  absl::StatusOr<int64_t> bytes = GgmlTensorBytes(type, dims);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "': ", bytes.status().message()));
  }
  if (has_data && static_cast<uint64_t>(*bytes) != data.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "': ", data.size(), " bytes given, its type and shape need ", *bytes));
  }
  const uint64_t size = static_cast<uint64_t>(*bytes);
  const uint64_t offset = data_bytes_;
  data_bytes_ += size + Padding(size, alignment_);
  tensors_.push_back(
      {std::string(name), type, std::move(dims), std::move(data), offset, size, has_data});
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
    if (t.has_data) {
      out.append(t.data);
    } else {
      out.append(t.bytes, '\0');
    }
    out.append(Padding(t.bytes, alignment_), '\0');
  }
  return out;
}

absl::Status GgufWriter::WriteFile(const std::string& path) const {
  absl::StatusOr<GgufStreamWriter> out = StartFile(path);
  if (!out.ok()) return out.status();
  absl::Status s = out->Finish();
  if (absl::IsDataLoss(s)) return absl::InvalidArgumentError(absl::StrCat(path, ": write failed"));
  return s;
}

absl::StatusOr<GgufStreamWriter> GgufWriter::StartFile(const std::string& path) const {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot create the file"));
  }
  GgufStreamWriter out(this, f, path);
  const std::string header = Header();
  out.ok_ = std::fwrite(header.data(), 1, header.size(), f) == header.size();
  out.ok_ = out.ok_ && out.Advance();
  if (!out.ok_) return absl::InvalidArgumentError(absl::StrCat(path, ": write failed"));
  return out;
}

void GgufStreamWriter::Closer::operator()(std::FILE* f) const { std::fclose(f); }

GgufStreamWriter::GgufStreamWriter(const GgufWriter* writer, std::FILE* f, std::string path)
    : writer_(writer), file_(f), path_(std::move(path)) {}

GgufStreamWriter::~GgufStreamWriter() = default;

const std::string* GgufStreamWriter::current_tensor() const {
  return next_ < writer_->tensors_.size() ? &writer_->tensors_[next_].name : nullptr;
}

bool GgufStreamWriter::Advance() {
  static constexpr char kZeros[256] = {};
  const std::vector<GgufWriter::Tensor>& tensors = writer_->tensors_;
  auto pad = [&](uint64_t size) {
    for (uint64_t left = Padding(size, writer_->alignment_); left > 0 && ok_;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(left, sizeof kZeros));
      ok_ = std::fwrite(kZeros, 1, n, file_.get()) == n;
      left -= n;
    }
  };
  while (ok_ && next_ < tensors.size()) {
    const GgufWriter::Tensor& t = tensors[next_];
    if (!t.has_data && written_ < t.bytes) break;  // the caller's turn
    if (t.has_data && !t.data.empty()) {
      ok_ = std::fwrite(t.data.data(), 1, t.data.size(), file_.get()) == t.data.size();
    }
    pad(t.bytes);
    ++next_;
    written_ = 0;
  }
  return ok_;
}

absl::Status GgufStreamWriter::Write(const void* data, size_t n) {
  if (!ok_) return absl::DataLossError(absl::StrCat(path_, ": write failed"));
  const std::string* name = current_tensor();
  if (name == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": ", n, " bytes written after the last tensor"));
  }
  const GgufWriter::Tensor& t = writer_->tensors_[next_];
  if (n > t.bytes - written_) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor '", t.name, "' takes ",
                                                   t.bytes, " bytes; ", written_ + n, " given"));
  }
  ok_ = n == 0 || std::fwrite(data, 1, n, file_.get()) == n;
  written_ += n;
  if (ok_ && written_ == t.bytes) Advance();
  if (!ok_) return absl::DataLossError(absl::StrCat(path_, ": write failed"));
  return absl::OkStatus();
}

absl::Status GgufStreamWriter::Finish() {
  if (const std::string* name = current_tensor(); name != nullptr && ok_) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": tensor '", *name, "' has ", written_, " of its ",
                     writer_->tensors_[next_].bytes, " bytes"));
  }
  if (file_ != nullptr && std::fclose(file_.release()) != 0) ok_ = false;
  if (!ok_) return absl::DataLossError(absl::StrCat(path_, ": write failed"));
  return absl::OkStatus();
}

}  // namespace heavykv
