// GgufMetadata's values and GgufFile's typed lookups; the parser that validates what they read is
// in gguf.cc.
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/gguf/gguf.h"

namespace heavykv {
namespace {

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

GgufScalar DecodeScalar(GgufValueType type, const uint8_t* p) {
  switch (type) {
    case GgufValueType::kU8:
      return uint64_t{Load<uint8_t>(p)};
    case GgufValueType::kI8:
      return int64_t{Load<int8_t>(p)};
    case GgufValueType::kU16:
      return uint64_t{Load<uint16_t>(p)};
    case GgufValueType::kI16:
      return int64_t{Load<int16_t>(p)};
    case GgufValueType::kU32:
      return uint64_t{Load<uint32_t>(p)};
    case GgufValueType::kI32:
      return int64_t{Load<int32_t>(p)};
    case GgufValueType::kU64:
      return Load<uint64_t>(p);
    case GgufValueType::kI64:
      return Load<int64_t>(p);
    case GgufValueType::kF32:
      return double{Load<float>(p)};
    case GgufValueType::kF64:
      return Load<double>(p);
    case GgufValueType::kBool:
      return Load<uint8_t>(p) != 0;
    case GgufValueType::kString:
    case GgufValueType::kArray:
      break;
  }
  return uint64_t{0};
}

// The string at p (length-prefixed), which Open has validated.
absl::string_view StringAt(const uint8_t* p) {
  return {reinterpret_cast<const char*>(p + 8), static_cast<size_t>(Load<uint64_t>(p))};
}

}  // namespace

uint64_t GgufScalarBytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kU16:
    case GgufValueType::kI16:
      return 2;
    case GgufValueType::kU32:
    case GgufValueType::kI32:
    case GgufValueType::kF32:
      return 4;
    case GgufValueType::kU64:
    case GgufValueType::kI64:
    case GgufValueType::kF64:
      return 8;
    case GgufValueType::kString:
    case GgufValueType::kArray:
      return 0;
  }
  return 0;
}

absl::string_view GgufValueTypeName(GgufValueType type) {
  switch (type) {
    case GgufValueType::kU8:
      return "u8";
    case GgufValueType::kI8:
      return "i8";
    case GgufValueType::kU16:
      return "u16";
    case GgufValueType::kI16:
      return "i16";
    case GgufValueType::kU32:
      return "u32";
    case GgufValueType::kI32:
      return "i32";
    case GgufValueType::kF32:
      return "f32";
    case GgufValueType::kBool:
      return "bool";
    case GgufValueType::kString:
      return "string";
    case GgufValueType::kArray:
      return "array";
    case GgufValueType::kU64:
      return "u64";
    case GgufValueType::kI64:
      return "i64";
    case GgufValueType::kF64:
      return "f64";
  }
  return "?";
}

bool IsGgufIntegerType(GgufValueType type) {
  switch (type) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kU16:
    case GgufValueType::kI16:
    case GgufValueType::kU32:
    case GgufValueType::kI32:
    case GgufValueType::kU64:
    case GgufValueType::kI64:
      return true;
    default:
      return false;
  }
}

GgufScalar GgufMetadata::Value() const {
  if (type == GgufValueType::kString) {
    return absl::string_view(reinterpret_cast<const char*>(raw.data()), raw.size());
  }
  return DecodeScalar(type, raw.data());
}

GgufScalar GgufMetadata::Element(uint64_t i) const {
  if (element_type != GgufValueType::kString) {
    return DecodeScalar(element_type, raw.data() + i * GgufScalarBytes(element_type));
  }
  const uint8_t* p = raw.data();
  for (uint64_t k = 0; k < i; ++k) p += 8 + Load<uint64_t>(p);
  return StringAt(p);
}

absl::StatusOr<const GgufMetadata*> GgufFile::Require(absl::string_view key) const {
  const GgufMetadata* m = FindMetadata(key);
  if (m == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": metadata key '", key, "' is missing"));
  }
  return m;
}

absl::Status GgufFile::WrongType(const GgufMetadata& m, absl::string_view wanted) const {
  const std::string have = m.is_array()
                               ? absl::StrCat("array of ", GgufValueTypeName(m.element_type))
                               : std::string(GgufValueTypeName(m.type));
  return absl::InvalidArgumentError(
      absl::StrCat(path_, ": metadata key '", m.key, "' is a ", have, ", not a ", wanted));
}

namespace {

// An integer scalar converted to T when its value fits.
template <typename T>
std::optional<T> FitInt(const GgufScalar& v) {
  if (const uint64_t* u = std::get_if<uint64_t>(&v)) {
    if (std::in_range<T>(*u)) return static_cast<T>(*u);
  } else if (const int64_t* s = std::get_if<int64_t>(&v)) {
    if (std::in_range<T>(*s)) return static_cast<T>(*s);
  }
  return std::nullopt;
}

std::string ScalarText(const GgufScalar& v) {
  if (const uint64_t* u = std::get_if<uint64_t>(&v)) return absl::StrCat(*u);
  if (const int64_t* s = std::get_if<int64_t>(&v)) return absl::StrCat(*s);
  return "?";
}

template <typename T>
absl::StatusOr<T> GetInt(const GgufFile& f, absl::string_view key, absl::string_view name,
                         absl::StatusOr<const GgufMetadata*> m, absl::Status wrong_type) {
  if (!m.ok()) return m.status();
  if (!IsGgufIntegerType((*m)->type)) return wrong_type;
  const GgufScalar v = (*m)->Value();
  if (std::optional<T> x = FitInt<T>(v)) return *x;
  return absl::InvalidArgumentError(absl::StrCat(f.path(), ": metadata key '", key, "': value ",
                                                 ScalarText(v), " does not fit a ", name));
}

}  // namespace

absl::StatusOr<uint32_t> GgufFile::GetU32(absl::string_view key) const {
  auto m = Require(key);
  return GetInt<uint32_t>(*this, key, "u32", m, m.ok() ? WrongType(**m, "u32") : m.status());
}
absl::StatusOr<int32_t> GgufFile::GetI32(absl::string_view key) const {
  auto m = Require(key);
  return GetInt<int32_t>(*this, key, "i32", m, m.ok() ? WrongType(**m, "i32") : m.status());
}
absl::StatusOr<uint64_t> GgufFile::GetU64(absl::string_view key) const {
  auto m = Require(key);
  return GetInt<uint64_t>(*this, key, "u64", m, m.ok() ? WrongType(**m, "u64") : m.status());
}
absl::StatusOr<int64_t> GgufFile::GetI64(absl::string_view key) const {
  auto m = Require(key);
  return GetInt<int64_t>(*this, key, "i64", m, m.ok() ? WrongType(**m, "i64") : m.status());
}

absl::StatusOr<float> GgufFile::GetF32(absl::string_view key) const {
  auto m = Require(key);
  if (!m.ok()) return m.status();
  if ((*m)->type != GgufValueType::kF32) return WrongType(**m, "f32");
  return Load<float>((*m)->raw.data());
}

absl::StatusOr<double> GgufFile::GetF64(absl::string_view key) const {
  auto m = Require(key);
  if (!m.ok()) return m.status();
  if ((*m)->type != GgufValueType::kF32 && (*m)->type != GgufValueType::kF64) {
    return WrongType(**m, "f32 or f64");
  }
  return std::get<double>((*m)->Value());
}

absl::StatusOr<bool> GgufFile::GetBool(absl::string_view key) const {
  auto m = Require(key);
  if (!m.ok()) return m.status();
  if ((*m)->type != GgufValueType::kBool) return WrongType(**m, "bool");
  return std::get<bool>((*m)->Value());
}

absl::StatusOr<absl::string_view> GgufFile::GetString(absl::string_view key) const {
  auto m = Require(key);
  if (!m.ok()) return m.status();
  if ((*m)->type != GgufValueType::kString) return WrongType(**m, "string");
  return std::get<absl::string_view>((*m)->Value());
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetArrayI64(absl::string_view key) const {
  auto m = Require(key);
  if (!m.ok()) return m.status();
  if (!(*m)->is_array() || !IsGgufIntegerType((*m)->element_type)) {
    return WrongType(**m, "array of integers");
  }
  std::vector<int64_t> out;
  out.reserve((*m)->count);  // validated: the elements are in the file
  for (uint64_t i = 0; i < (*m)->count; ++i) {
    const GgufScalar v = (*m)->Element(i);
    std::optional<int64_t> x = FitInt<int64_t>(v);
    if (!x) {
      return absl::InvalidArgumentError(absl::StrCat(path_, ": metadata key '", key, "': element #",
                                                     i, " (", ScalarText(v),
                                                     ") does not fit an i64"));
    }
    out.push_back(*x);
  }
  return out;
}

absl::StatusOr<std::vector<float>> GgufFile::GetArrayF32(absl::string_view key) const {
  auto m = Require(key);
  if (!m.ok()) return m.status();
  if (!(*m)->is_array() || (*m)->element_type != GgufValueType::kF32) {
    return WrongType(**m, "array of f32");
  }
  std::vector<float> out((*m)->count);
  if (!out.empty()) std::memcpy(out.data(), (*m)->raw.data(), out.size() * sizeof(float));
  return out;
}

absl::StatusOr<std::vector<absl::string_view>> GgufFile::GetArrayString(
    absl::string_view key) const {
  auto m = Require(key);
  if (!m.ok()) return m.status();
  if (!(*m)->is_array() || (*m)->element_type != GgufValueType::kString) {
    return WrongType(**m, "array of string");
  }
  std::vector<absl::string_view> out;
  out.reserve((*m)->count);
  const uint8_t* p = (*m)->raw.data();
  for (uint64_t i = 0; i < (*m)->count; ++i) {
    out.push_back(StringAt(p));
    p += 8 + out.back().size();
  }
  return out;
}

}  // namespace heavykv
