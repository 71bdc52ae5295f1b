// The values a chat template computes with (engine/chat/chat_template.h's interpreter): Python's
// types as jinja2 sees them — undefined, None, bool, int, float, str, list/tuple, dict,
// namespace and the callable globals — with Python's truthiness, equality, str() and repr(),
// and Hugging Face's `tojson` (json.dumps with ensure_ascii=False).
//
// Strings are UTF-8 bytes; operations that Python defines on code points (len, indexing,
// slicing, strip) decode them. Lists and dicts are shared and immutable once built, except a
// namespace's dict, which `{% set ns.x = ... %}` mutates in place (jinja2's Namespace).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace heavykv::jinja {

class Value;
using ValueList = std::vector<Value>;
using ValueDict = std::vector<std::pair<Value, Value>>;  // insertion ordered, like Python's dict

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,  // also a tuple (is_tuple())
    kDict,
    kNamespace,
    kFunction,  // a global callable, named by str_
  };

  Value() = default;  // undefined
  static Value Undefined(std::string name);
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value String(std::string s);
  static Value List(ValueList items, bool tuple = false);
  static Value Dict(ValueDict items);
  static Value Namespace(ValueDict items);
  static Value Function(std::string name);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const {
    return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool;
  }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict || kind_ == Kind::kNamespace; }
  bool is_tuple() const { return kind_ == Kind::kList && tuple_; }

  bool b() const { return b_; }
  int64_t i() const { return kind_ == Kind::kBool ? b_ : i_; }
  double f() const { return kind_ == Kind::kFloat ? f_ : static_cast<double>(i()); }
  // A string, or the undefined/function name.
  const std::string& str() const { return str_ ? *str_ : EmptyString(); }
  const ValueList& list() const { return *list_; }
  const ValueDict& dict() const { return *dict_; }
  ValueDict& mutable_namespace() const { return *dict_; }

  // dict[key] / namespace.key; undefined when absent.
  Value Get(const Value& key) const;
  Value Get(const std::string& key) const { return Get(String(key)); }

  bool Truthy() const;
  // Python's str() and repr(). Past `limit` bytes the text is cut short (still longer than
  // `limit`, so a caller that checks the size refuses it without building all of it).
  std::string Str(size_t limit = std::string::npos) const;
  std::string Repr(size_t limit = std::string::npos) const;
  // Python's type name, for error messages.
  const char* TypeName() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool tuple_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  static const std::string& EmptyString();
  void ReprTo(std::string* out, size_t limit, int depth) const;

  std::shared_ptr<const std::string> str_;  // shared: copying a Value never copies its text
  std::shared_ptr<const ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
};

// Python's ==.
bool Equal(const Value& a, const Value& b);
// Python's <, for numbers and strings (code point order = UTF-8 byte order) and lists;
// INVALID_ARGUMENT for other types.
absl::StatusOr<bool> Less(const Value& a, const Value& b);

// Python's repr() of a float (shortest round-trip digits, "1e+16" past 16 digits).
std::string FloatRepr(double f);
// json.dumps's arguments as HF's tojson passes them.
struct JsonOptions {
  int indent = -1;  // None
  bool sort_keys = false;
  bool ensure_ascii = false;
  std::string item_sep;  // empty: json.dumps' default, ", " (or "," with an indent)
  std::string key_sep = ": ";
};
// json.dumps(v, ...); INVALID_ARGUMENT for undefined or a callable, RESOURCE_EXHAUSTED past
// `limit` bytes.
absl::StatusOr<std::string> ToJson(const Value& v, const JsonOptions& opts, size_t limit);

// UTF-8 helpers: code points of `s` (invalid bytes decode as themselves, like surrogateescape)
// and back.
std::vector<uint32_t> DecodeUtf8(const std::string& s);
std::string EncodeUtf8(const std::vector<uint32_t>& cps, size_t begin, size_t end);
void AppendUtf8(uint32_t cp, std::string* out);
// Python's str.isspace() for one code point.
bool IsPySpace(uint32_t cp);

}  // namespace heavykv::jinja
