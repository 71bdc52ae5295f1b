// Python semantics for engine/chat/chat_template_value.h's values.
#include "engine/chat/chat_template_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace heavykv::jinja {

const std::string& Value::EmptyString() {
  static const std::string* empty = new std::string;
  return *empty;
}

Value Value::Undefined(std::string name) {
  Value v;
  v.str_ = std::make_shared<const std::string>(std::move(name));
  return v;
}
Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
Value Value::Float(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.str_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::List(ValueList items, bool tuple) {
  Value v;
  v.kind_ = Kind::kList;
  v.tuple_ = tuple;
  v.list_ = std::make_shared<const ValueList>(std::move(items));
  return v;
}
Value Value::Dict(ValueDict items) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<ValueDict>(std::move(items));
  return v;
}
Value Value::Namespace(ValueDict items) {
  Value v = Dict(std::move(items));
  v.kind_ = Kind::kNamespace;
  return v;
}
Value Value::Function(std::string name) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.str_ = std::make_shared<const std::string>(std::move(name));
  return v;
}

Value Value::Get(const Value& key) const {
  if (is_dict()) {
    for (const auto& [k, v] : *dict_) {
      if (Equal(k, key)) return v;
    }
  }
  return Undefined(key.Str(/*limit=*/100));
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0;
    case Kind::kString:
      return !str().empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return !dict_->empty();
    case Kind::kNamespace:
    case Kind::kFunction:
      return true;
  }
  return false;
}

const char* Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return tuple_ ? "tuple" : "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kFunction:
      return "function";
  }
  return "?";
}

std::string FloatRepr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // "-d.ddde+XX"
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  const size_t e_pos = sci.find('e');
  int exp = std::stoi(sci.substr(e_pos + 1));
  std::string digits;
  for (size_t k = 0; k < e_pos; ++k) {
    if (sci[k] != '.') digits += sci[k];
  }
  std::string out = neg ? "-" : "";
  if (exp < -4 || exp >= 16) {
    out += digits[0];
    if (digits.size() > 1) absl::StrAppend(&out, ".", digits.substr(1));
    absl::StrAppend(&out, exp < 0 ? "e-" : "e+", absl::StrFormat("%02d", std::abs(exp)));
    return out;
  }
  if (exp < 0) {
    absl::StrAppend(&out, "0.", std::string(-exp - 1, '0'), digits);
    return out;
  }
  const size_t int_len = static_cast<size_t>(exp) + 1;
  if (digits.size() <= int_len) {
    absl::StrAppend(&out, digits, std::string(int_len - digits.size(), '0'), ".0");
  } else {
    absl::StrAppend(&out, digits.substr(0, int_len), ".", digits.substr(int_len));
  }
  return out;
}

namespace {

// Python's str.isprintable() for one code point, for repr(): the common non-printable ranges.
bool IsPyPrintable(uint32_t cp) {
  if (cp < 0x20 || (cp >= 0x7f && cp <= 0xa0) || cp == 0xad) return false;
  if ((cp >= 0x2000 && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202f)) return false;
  if ((cp >= 0x205f && cp <= 0x206f) || cp == 0x3000 || cp == 0xfeff || cp == 0x1680) {
    return false;
  }
  if (cp >= 0xd800 && cp <= 0xdfff) return false;
  if (cp >= 0xe000 && cp <= 0xf8ff) return false;  // private use
  return true;
}

std::string StringRepr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (uint32_t cp : DecodeUtf8(s)) {
    if (cp == '\\') {
      out += "\\\\";
    } else if (cp == static_cast<uint32_t>(quote)) {
      out += '\\';
      out += quote;
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (IsPyPrintable(cp)) {
      AppendUtf8(cp, &out);
    } else if (cp < 0x100) {
      out += absl::StrFormat("\\x%02x", cp);
    } else if (cp < 0x10000) {
      out += absl::StrFormat("\\u%04x", cp);
    } else {
      out += absl::StrFormat("\\U%08x", cp);
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string Value::Str(size_t limit) const {
  if (kind_ == Kind::kUndefined) return "";
  if (kind_ == Kind::kString) return str();
  return Repr(limit);
}

std::string Value::Repr(size_t limit) const {
  std::string out;
  ReprTo(&out, limit, 0);
  return out;
}

void Value::ReprTo(std::string* out, size_t limit, int depth) const {
  if (out->size() > limit) return;
  // A namespace can hold itself; Python prints such a cycle as "...".
  if (depth > 64) {
    *out += "...";
    return;
  }
  switch (kind_) {
    case Kind::kUndefined:
      return;
    case Kind::kNone:
      *out += "None";
      return;
    case Kind::kBool:
      *out += b_ ? "True" : "False";
      return;
    case Kind::kInt:
      absl::StrAppend(out, i_);
      return;
    case Kind::kFloat:
      *out += FloatRepr(f_);
      return;
    case Kind::kString:
      *out += StringRepr(str());
      return;
    case Kind::kList: {
      *out += tuple_ ? "(" : "[";
      for (size_t k = 0; k < list_->size() && out->size() <= limit; ++k) {
        if (k) *out += ", ";
        (*list_)[k].ReprTo(out, limit, depth + 1);
      }
      if (tuple_ && list_->size() == 1) *out += ",";
      *out += tuple_ ? ")" : "]";
      return;
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      *out += kind_ == Kind::kNamespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, v] : *dict_) {
        if (out->size() > limit) break;
        if (!first) *out += ", ";
        first = false;
        k.ReprTo(out, limit, depth + 1);
        *out += ": ";
        v.ReprTo(out, limit, depth + 1);
      }
      *out += kind_ == Kind::kNamespace ? "}>" : "}";
      return;
    }
    case Kind::kFunction:
      absl::StrAppend(out, "<function ", str(), ">");
      return;
  }
}

bool Equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind() == K::kFloat || b.kind() == K::kFloat) return a.f() == b.f();
    return a.i() == b.i();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:
    case K::kFunction:
      return a.str() == b.str();
    case K::kList:
      if (a.is_tuple() != b.is_tuple() || a.list().size() != b.list().size()) return false;
      for (size_t k = 0; k < a.list().size(); ++k) {
        if (!Equal(a.list()[k], b.list()[k])) return false;
      }
      return true;
    case K::kDict:
      if (a.dict().size() != b.dict().size()) return false;
      for (const auto& [k, v] : a.dict()) {
        Value other = b.Get(k);
        if (other.is_undefined() || !Equal(v, other)) return false;
      }
      return true;
    case K::kNamespace:
      return &a.dict() == &b.dict();
    default:
      return false;
  }
}

absl::StatusOr<bool> Less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat) return a.f() < b.f();
    return a.i() < b.i();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();
  if (a.is_list() && b.is_list()) {
    const size_t n = std::min(a.list().size(), b.list().size());
    for (size_t k = 0; k < n; ++k) {
      if (Equal(a.list()[k], b.list()[k])) continue;
      return Less(a.list()[k], b.list()[k]);
    }
    return a.list().size() < b.list().size();
  }
  return absl::InvalidArgumentError(absl::StrCat("'<' not supported between instances of '",
                                                 a.TypeName(), "' and '", b.TypeName(), "'"));
}

namespace {

// One byte of a JSON string as json.dumps writes it (bytes >= 0x80 pass through).
void JsonByte(char c, std::string* out) {
  switch (c) {
    case '"':
      *out += "\\\"";
      break;
    case '\\':
      *out += "\\\\";
      break;
    case '\n':
      *out += "\\n";
      break;
    case '\r':
      *out += "\\r";
      break;
    case '\t':
      *out += "\\t";
      break;
    case '\b':
      *out += "\\b";
      break;
    case '\f':
      *out += "\\f";
      break;
    default:
      if (static_cast<uint8_t>(c) < 0x20) {
        *out += absl::StrFormat("\\u%04x", static_cast<uint8_t>(c));
      } else {
        *out += c;
      }
  }
}

void JsonString(const std::string& s, bool ensure_ascii, std::string* out) {
  *out += '"';
  if (!ensure_ascii) {
    for (char c : s) JsonByte(c, out);
  } else {
    // Non-ASCII as \uXXXX escapes (UTF-16 surrogate pairs past the BMP), like json.dumps.
    for (uint32_t cp : DecodeUtf8(s)) {
      if (cp < 0x80) {
        JsonByte(static_cast<char>(cp), out);
      } else if (cp < 0x10000) {
        *out += absl::StrFormat("\\u%04x", cp);
      } else {
        const uint32_t v = cp - 0x10000;
        *out += absl::StrFormat("\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      }
    }
  }
  *out += '"';
}

absl::Status JsonValue(const Value& v, const JsonOptions& o, int level, size_t limit,
                       std::string* out) {
  const int indent = o.indent;
  using K = Value::Kind;
  if (level > 256) return absl::InvalidArgumentError("tojson: nesting too deep");
  if (out->size() > limit) {
    return absl::ResourceExhaustedError(absl::StrCat("tojson: output past ", limit, " bytes"));
  }
  auto newline = [&](int lvl) {
    if (indent >= 0)
      absl::StrAppend(out, "\n", std::string(static_cast<size_t>(indent * lvl), ' '));
  };
  const std::string item_sep = !o.item_sep.empty() ? o.item_sep : indent >= 0 ? "," : ", ";
  switch (v.kind()) {
    case K::kNone:
      *out += "null";
      return absl::OkStatus();
    case K::kBool:
      *out += v.b() ? "true" : "false";
      return absl::OkStatus();
    case K::kInt:
      absl::StrAppend(out, v.i());
      return absl::OkStatus();
    case K::kFloat:
      if (std::isnan(v.f())) {
        *out += "NaN";
      } else if (std::isinf(v.f())) {
        *out += v.f() > 0 ? "Infinity" : "-Infinity";
      } else {
        *out += FloatRepr(v.f());
      }
      return absl::OkStatus();
    case K::kString:
      JsonString(v.str(), o.ensure_ascii, out);
      return absl::OkStatus();
    case K::kList: {
      if (v.list().empty()) {
        *out += "[]";
        return absl::OkStatus();
      }
      *out += '[';
      for (size_t k = 0; k < v.list().size(); ++k) {
        if (k) *out += item_sep;
        newline(level + 1);
        if (auto s = JsonValue(v.list()[k], o, level + 1, limit, out); !s.ok()) return s;
      }
      newline(level);
      *out += ']';
      return absl::OkStatus();
    }
    case K::kDict: {
      if (v.dict().empty()) {
        *out += "{}";
        return absl::OkStatus();
      }
      std::vector<std::pair<std::string, const Value*>> items;
      for (const auto& [k, val] : v.dict()) {
        std::string key;
        switch (k.kind()) {
          case K::kString:
            key = k.str();
            break;
          case K::kNone:
            key = "null";
            break;
          case K::kBool:
            key = k.b() ? "true" : "false";
            break;
          case K::kInt:
          case K::kFloat:
            key = k.Repr();
            break;
          default:
            return absl::InvalidArgumentError(absl::StrCat(
                "tojson: keys must be str, int, float, bool or None, not ", k.TypeName()));
        }
        items.emplace_back(std::move(key), &val);
      }
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto& x, const auto& y) { return x.first < y.first; });
      }
      *out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) *out += item_sep;
        newline(level + 1);
        JsonString(items[k].first, o.ensure_ascii, out);
        *out += o.key_sep;
        if (auto s = JsonValue(*items[k].second, o, level + 1, limit, out); !s.ok()) {
          return s;
        }
      }
      newline(level);
      *out += '}';
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("tojson: Object of type ", v.TypeName(), " is not JSON serializable"));
  }
}

}  // namespace

absl::StatusOr<std::string> ToJson(const Value& v, const JsonOptions& opts, size_t limit) {
  std::string out;
  if (auto s = JsonValue(v, opts, 0, limit, &out); !s.ok()) return s;
  return out;
}

std::vector<uint32_t> DecodeUtf8(const std::string& s) {
  std::vector<uint32_t> cps;
  cps.reserve(s.size());
  size_t k = 0;
  while (k < s.size()) {
    const auto c = static_cast<uint8_t>(s[k]);
    int len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      len = 1;
      cp = c;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    }
    bool ok = len > 0 && k + static_cast<size_t>(len) <= s.size();
    for (int j = 1; ok && j < len; ++j) {
      const auto cc = static_cast<uint8_t>(s[k + static_cast<size_t>(j)]);
      if ((cc & 0xC0) != 0x80) ok = false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Overlong forms, surrogates and out-of-range values are invalid too.
    if (ok && ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) ||
               (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))) {
      ok = false;
    }
    if (!ok) {
      cps.push_back(0xDC00 + c);  // Python's surrogateescape: the byte survives a round trip
      ++k;
      continue;
    }
    cps.push_back(cp);
    k += static_cast<size_t>(len);
  }
  return cps;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp >= 0xDC80 && cp <= 0xDCFF) {
    *out += static_cast<char>(cp - 0xDC00);
  } else if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string EncodeUtf8(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t k = begin; k < end; ++k) AppendUtf8(cps[k], &out);
  return out;
}

bool IsPySpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

}  // namespace heavykv::jinja
