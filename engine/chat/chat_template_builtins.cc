// jinja2's tests and globals, Python's str/dict methods and the shared lookups for the
// interpreter (engine/chat/chat_template_builtins.h).
#include "engine/chat/chat_template_builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "engine/chat/chat_template_strings.h"

namespace heavykv::jinja {
absl::Status TypeError(const std::string& what) { return absl::InvalidArgumentError(what); }

absl::StatusOr<std::string> StrArg(const Args& args, size_t index, const char* name,
                                   const char* fn) {
  const Value* v = args.Get(index, name);
  if (!v || !v->is_string()) {
    return TypeError(absl::StrCat(fn, "() argument '", name, "' must be str"));
  }
  return v->str();
}

int64_t IntArg(const Args& args, size_t index, const char* name, int64_t fallback) {
  const Value* v = args.Get(index, name);
  return v && v->is_number() ? v->i() : fallback;
}

bool BoolArg(const Args& args, size_t index, const char* name, bool fallback) {
  const Value* v = args.Get(index, name);
  return v ? v->Truthy() : fallback;
}

// Python's str.startswith/endswith with a str or tuple of str.
static absl::StatusOr<Value> AffixTest(const std::string& s, const Value* arg, bool start) {
  if (!arg) return TypeError("startswith/endswith takes one argument");
  std::vector<Value> options = arg->is_list() ? arg->list() : std::vector<Value>{*arg};
  for (const Value& o : options) {
    if (!o.is_string()) return TypeError("startswith/endswith argument must be str or a tuple");
    const std::string& a = o.str();
    if (a.size() > s.size()) continue;
    if (start ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0) {
      return Value::Bool(true);
    }
  }
  return Value::Bool(false);
}

// A dotted attribute path ("a.b", "0") looked up as jinja2's make_attrgetter does.
absl::StatusOr<Value> AttrPath(const Value& v, const std::string& path) {
  Value cur = v;
  for (const std::string& part : std::vector<std::string>(absl::StrSplit(path, '.'))) {
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    auto next = digits ? GetItem(cur, Value::Int(std::atoll(part.c_str()))) : GetAttr(cur, part);
    if (!next.ok()) return next;
    cur = *next;
  }
  return cur;
}

const Value* Args::Get(size_t index, const char* name) const {
  if (index < pos.size()) return &pos[index];
  for (const auto& [k, v] : kw) {
    if (k == name) return &v;
  }
  return nullptr;
}

absl::Status UndefinedError(const Value& v) {
  return absl::InvalidArgumentError(absl::StrCat("'", v.str(), "' is undefined"));
}

absl::StatusOr<Value> GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return UndefinedError(obj);
  if (obj.is_dict()) return obj.Get(key);
  if ((obj.is_list() || obj.is_string()) && key.is_number() && key.kind() != Value::Kind::kFloat) {
    int64_t i = key.i();
    if (obj.is_list()) {
      const int64_t n = static_cast<int64_t>(obj.list().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::Undefined(absl::StrCat(obj.TypeName(), " index"));
      return obj.list()[static_cast<size_t>(i)];
    }
    std::vector<uint32_t> cps = DecodeUtf8(obj.str());
    const int64_t n = static_cast<int64_t>(cps.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::Undefined("str index");
    return Value::String(EncodeUtf8(cps, static_cast<size_t>(i), static_cast<size_t>(i) + 1));
  }
  return Value::Undefined(key.Str(/*limit=*/100));
}

absl::StatusOr<Value> GetAttr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) return UndefinedError(obj);
  if (obj.is_dict()) return obj.Get(name);
  return Value::Undefined(name);
}

absl::StatusOr<std::vector<Value>> Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return std::vector<Value>{};
    case Value::Kind::kList:
      return v.list();
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& [k, val] : v.dict()) keys.push_back(k);
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<uint32_t> cps = DecodeUtf8(v.str());
      std::vector<Value> chars;
      for (size_t k = 0; k < cps.size(); ++k)
        chars.push_back(Value::String(EncodeUtf8(cps, k, k + 1)));
      return chars;
    }
    default:
      return TypeError(absl::StrCat("'", v.TypeName(), "' object is not iterable"));
  }
}

absl::StatusOr<int64_t> Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kList:
      return static_cast<int64_t>(v.list().size());
    case Value::Kind::kDict:
      return static_cast<int64_t>(v.dict().size());
    case Value::Kind::kString:
      return static_cast<int64_t>(DecodeUtf8(v.str()).size());
    default:
      return TypeError(absl::StrCat("object of type '", v.TypeName(), "' has no len()"));
  }
}

bool IsGlobal(const std::string& name) {
  return name == "range" || name == "namespace" || name == "raise_exception" ||
         name == "strftime_now" || name == "dict";
}

absl::StatusOr<Value> CallGlobal(const std::string& name, const Args& args, BuiltinContext& ctx) {
  if (name == "raise_exception") {
    const Value* msg = args.Get(0, "message");
    return absl::Status(kRaisedCode, msg ? msg->Str(/*limit=*/4096) : "");
  }
  if (name == "strftime_now") {
    auto fmt = StrArg(args, 0, "format", "strftime_now");
    if (!fmt.ok()) return fmt.status();
    return Value::String(absl::FormatTime(*fmt, ctx.now, absl::UTCTimeZone()));
  }
  if (name == "namespace" || name == "dict") {
    ValueDict items;
    if (!args.pos.empty()) {
      if (!args.pos[0].is_dict()) return TypeError(name + "() takes a dict or keyword arguments");
      items = args.pos[0].dict();
    }
    for (const auto& [k, v] : args.kw) items.emplace_back(Value::String(k), v);
    if (name == "dict") return Value::Dict(std::move(items));
    Value ns = Value::Namespace(std::move(items));
    ctx.namespaces.push_back(ns);
    return ns;
  }
  if (name == "range") {
    int64_t start = 0, stop = 0, step = 1;
    for (const Value& v : args.pos) {
      if (v.kind() != Value::Kind::kInt && v.kind() != Value::Kind::kBool) {
        return TypeError("range() takes integers");
      }
    }
    if (args.pos.size() == 1) {
      stop = args.pos[0].i();
    } else if (args.pos.size() == 2 || args.pos.size() == 3) {
      start = args.pos[0].i();
      stop = args.pos[1].i();
      if (args.pos.size() == 3) step = args.pos[2].i();
    } else {
      return TypeError("range() takes 1 to 3 arguments");
    }
    if (step == 0) return TypeError("range() arg 3 must not be zero");
    const double count = std::max(0.0, std::ceil((static_cast<double>(stop) - start) / step));
    if (count > 100000) {
      return TypeError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    }
    if (auto s = ctx.budget->Items(static_cast<int64_t>(count)); !s.ok()) return s;
    ValueList out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(Value::Int(i));
    return Value::List(std::move(out));
  }
  return TypeError(absl::StrCat("'", name, "' is not callable"));
}

absl::StatusOr<Value> CallMethod(const Value& self, const std::string& name, const Args& args,
                                 BuiltinContext& ctx) {
  if (self.is_string()) {
    const std::string& s = self.str();
    const Value* a0 = args.Get(0, "chars");
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const std::string* chars = a0 && a0->is_string() ? &a0->str() : nullptr;
      return Value::String(PyStrip(s, chars, name != "rstrip", name != "lstrip"));
    }
    if (name == "split") {
      const Value* sep = args.Get(0, "sep");
      if (sep && sep->is_string() && sep->str().empty()) return TypeError("empty separator");
      const std::string* sep_str = sep && sep->is_string() ? &sep->str() : nullptr;
      ValueList out;
      for (auto& part : PySplit(s, sep_str, IntArg(args, 1, "maxsplit", -1))) {
        out.push_back(Value::String(std::move(part)));
      }
      return Value::List(std::move(out));
    }
    if (name == "startswith" || name == "endswith") {
      return AffixTest(s, args.Get(0, "prefix"), name == "startswith");
    }
    if (name == "upper") return Value::String(PyUpper(s));
    if (name == "lower") return Value::String(PyLower(s));
    if (name == "title") return Value::String(PyTitle(s));
    if (name == "capitalize") return Value::String(PyCapitalize(s));
    if (name == "replace") {
      auto from = StrArg(args, 0, "old", "replace");
      auto to = StrArg(args, 1, "new", "replace");
      if (!from.ok()) return from.status();
      if (!to.ok()) return to.status();
      const int64_t count = IntArg(args, 2, "count", -1);
      // The result's size, counted before it is built.
      int64_t hits = 0;
      if (from->empty()) {
        hits = static_cast<int64_t>(DecodeUtf8(s).size()) + 1;
      } else {
        for (size_t at = s.find(*from); at != std::string::npos;
             at = s.find(*from, at + from->size())) {
          ++hits;
        }
      }
      if (count >= 0) hits = std::min(hits, count);
      const int64_t size =
          static_cast<int64_t>(s.size()) +
          hits * (static_cast<int64_t>(to->size()) - static_cast<int64_t>(from->size()));
      if (auto st = ctx.budget->Size(size); !st.ok()) return st;
      return Value::String(PyReplace(s, *from, *to, count));
    }
    if (name == "find") {
      auto sub = StrArg(args, 0, "sub", "find");
      if (!sub.ok()) return sub.status();
      return Value::Int(PyFind(s, *sub));
    }
    if (name == "join") {
      auto items = Iterate(args.pos.empty() ? Value() : args.pos[0]);
      if (!items.ok()) return items.status();
      std::string out;
      for (size_t k = 0; k < items->size(); ++k) {
        if (!(*items)[k].is_string()) return TypeError("join: sequence item is not a str");
        if (k) out += s;
        out += (*items)[k].str();
        if (auto st = ctx.budget->Size(static_cast<int64_t>(out.size())); !st.ok()) return st;
      }
      return Value::String(std::move(out));
    }
  } else if (self.is_dict() && self.kind() == Value::Kind::kDict) {
    if (name == "items" || name == "keys" || name == "values") {
      ValueList out;
      for (const auto& [k, v] : self.dict()) {
        if (name == "items") {
          out.push_back(Value::List({k, v}, /*tuple=*/true));
        } else {
          out.push_back(name == "keys" ? k : v);
        }
      }
      return Value::List(std::move(out));
    }
    if (name == "get") {
      const Value* key = args.Get(0, "key");
      if (!key) return TypeError("get expected at least 1 argument");
      Value got = self.Get(*key);
      if (!got.is_undefined()) return got;
      const Value* fallback = args.Get(1, "default");
      return fallback ? *fallback : Value::None();
    }
  }
  if (self.is_undefined()) return UndefinedError(self);
  if (self.is_list() &&
      (name == "append" || name == "pop" || name == "insert" || name == "extend" ||
       name == "remove" || name == "clear" || name == "sort" || name == "reverse")) {
    return TypeError(absl::StrCat("access to attribute '", name, "' of '", self.TypeName(),
                                  "' object is unsafe"));
  }
  return TypeError(
      absl::StrCat("'", self.TypeName(), "' object has no callable attribute '", name, "'"));
}

absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& v, const Args& args) {
  using K = Value::Kind;
  const Value* arg = args.Get(0, "other");
  auto need_arg = [&]() -> absl::Status {
    return arg ? absl::OkStatus() : TypeError(absl::StrCat("test '", name, "' takes an argument"));
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind() == K::kBool;
  if (name == "true") return v.kind() == K::kBool && v.b();
  if (name == "false") return v.kind() == K::kBool && !v.b();
  if (name == "integer") return v.kind() == K::kInt;
  if (name == "float") return v.kind() == K::kFloat;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.kind() == K::kDict;
  if (name == "iterable" || name == "sequence") {
    return v.is_undefined() || v.is_string() || v.is_list() || v.kind() == K::kDict;
  }
  if (name == "callable") return v.kind() == K::kFunction;
  if (name == "lower") return v.is_string() && PyLower(v.str()) == v.str();
  if (name == "upper") return v.is_string() && PyUpper(v.str()) == v.str();
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (v.kind() != K::kInt && v.kind() != K::kBool) {
      return TypeError(absl::StrCat("test '", name, "' needs an integer"));
    }
    if (name == "divisibleby") {
      if (auto s = need_arg(); !s.ok()) return s;
      if (!arg->is_number() || arg->i() == 0) return TypeError("divisibleby: bad divisor");
      return v.i() % arg->i() == 0;
    }
    return (v.i() % 2 != 0) == (name == "odd");
  }
  if (name == "sameas") {
    if (auto s = need_arg(); !s.ok()) return s;
    // Python's `is`: identity, which for None/True/False and small ints is equality of kind+value.
    return v.kind() == arg->kind() && Equal(v, *arg);
  }
  if (name == "in") {
    if (auto s = need_arg(); !s.ok()) return s;
    if (arg->is_string()) {
      if (!v.is_string()) return TypeError("'in <string>' requires string as left operand");
      return arg->str().find(v.str()) != std::string::npos;
    }
    auto items = Iterate(*arg);
    if (!items.ok()) return items.status();
    for (const Value& item : *items) {
      if (Equal(item, v)) return true;
    }
    return false;
  }
  if (name == "eq" || name == "equalto" || name == "==" || name == "ne" || name == "!=") {
    if (auto s = need_arg(); !s.ok()) return s;
    return Equal(v, *arg) == (name[0] == 'e' || name[0] == '=');
  }
  if (name == "lt" || name == "<" || name == "ge" || name == ">=") {
    if (auto s = need_arg(); !s.ok()) return s;
    auto r = Less(v, *arg);
    if (!r.ok()) return r.status();
    return *r == (name == "lt" || name == "<");
  }
  if (name == "gt" || name == ">" || name == "le" || name == "<=") {
    if (auto s = need_arg(); !s.ok()) return s;
    auto r = Less(*arg, v);
    if (!r.ok()) return r.status();
    return *r == (name == "gt" || name == ">");
  }
  return TypeError(absl::StrCat("no test named '", name, "'"));
}

}  // namespace heavykv::jinja
