// jinja2's filters (engine/chat/chat_template_builtins.h's ApplyFilter), with jinja2 3.1's
// semantics.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/chat/chat_template_builtins.h"
#include "engine/chat/chat_template_strings.h"

namespace heavykv::jinja {
namespace {

absl::StatusOr<Value> SelectOrReject(const Value& seq, const Args& args, bool by_attr, bool keep) {
  auto items = Iterate(seq);
  if (!items.ok()) return items.status();
  size_t first_test_arg = by_attr ? 1 : 0;
  std::string attr;
  if (by_attr) {
    auto a = StrArg(args, 0, "attribute", "selectattr");
    if (!a.ok()) return a.status();
    attr = *a;
  }
  const Value* test = args.Get(first_test_arg, "test_name");
  Args test_args;
  for (size_t k = first_test_arg + 1; k < args.pos.size(); ++k)
    test_args.pos.push_back(args.pos[k]);
  ValueList out;
  for (const Value& item : *items) {
    Value subject = item;
    if (by_attr) {
      auto got = AttrPath(item, attr);
      if (!got.ok()) return got.status();
      subject = *got;
    }
    bool pass;
    if (!test) {
      pass = subject.Truthy();
    } else {
      if (!test->is_string()) return TypeError("select: the test name must be a string");
      auto r = ApplyTest(test->str(), subject, test_args);
      if (!r.ok()) return r.status();
      pass = *r;
    }
    if (pass == keep) out.push_back(item);
  }
  return Value::List(std::move(out));
}

absl::StatusOr<Value> MapFilter(const Value& seq, const Args& args, BuiltinContext& ctx) {
  auto items = Iterate(seq);
  if (!items.ok()) return items.status();
  ValueList out;
  if (const Value* attr = args.Get(99, "attribute")) {
    const Value* fallback = args.Get(99, "default");
    for (const Value& item : *items) {
      auto got = AttrPath(item, attr->Str());
      if (!got.ok()) return got.status();
      out.push_back(got->is_undefined() && fallback ? *fallback : *got);
    }
    return Value::List(std::move(out));
  }
  if (args.pos.empty() || !args.pos[0].is_string()) {
    return TypeError("map: give a filter name or attribute=");
  }
  Args rest;
  rest.pos.assign(args.pos.begin() + 1, args.pos.end());
  rest.kw = args.kw;
  for (const Value& item : *items) {
    auto got = ApplyFilter(args.pos[0].str(), item, rest, ctx);
    if (!got.ok()) return got;
    out.push_back(*got);
  }
  return Value::List(std::move(out));
}

absl::StatusOr<Value> Indent(const std::string& text, const Args& args) {
  std::string indention;
  const Value* width = args.Get(0, "width");
  if (width && width->is_string()) {
    indention = width->str();
  } else {
    indention.assign(static_cast<size_t>(std::clamp<int64_t>(IntArg(args, 0, "width", 4), 0, 256)),
                     ' ');
  }
  const bool first = BoolArg(args, 1, "first", false);
  const bool blank = BoolArg(args, 2, "blank", false);
  std::vector<std::string> lines = PySplitLines(text + "\n");
  std::string rv;
  if (blank) {
    rv = absl::StrJoin(lines, "\n" + indention);
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t k = 1; k < lines.size(); ++k) {
      rv += "\n";
      if (!lines[k].empty()) rv += indention;
      rv += lines[k];
    }
  }
  if (first) rv = indention + rv;
  return Value::String(std::move(rv));
}

// strtod reads "0x1p3" as hex; Python's int() and float() (base 10) do not.
bool HasHex(const std::string& s) {
  return s.find('x') != std::string::npos || s.find('X') != std::string::npos;
}

absl::StatusOr<Value> ToInt(const Value& v, const Args& args) {
  const Value* fallback = args.Get(0, "default");
  const Value def = fallback ? *fallback : Value::Int(0);
  if (v.kind() == Value::Kind::kInt || v.kind() == Value::Kind::kBool) return Value::Int(v.i());
  if (v.kind() == Value::Kind::kFloat) {
    if (!std::isfinite(v.f()) || std::fabs(v.f()) > 9.2e18) return def;
    return Value::Int(static_cast<int64_t>(v.f()));
  }
  if (v.is_string() && !HasHex(v.str())) {
    const std::string s = PyStrip(v.str(), nullptr, true, true);
    char* end = nullptr;
    errno = 0;
    const long long i = std::strtoll(s.c_str(), &end, 10);
    if (!s.empty() && end == s.c_str() + s.size() && errno == 0) return Value::Int(i);
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size() && std::isfinite(d) && std::fabs(d) < 9.2e18) {
      return Value::Int(static_cast<int64_t>(d));
    }
  }
  return def;
}

absl::StatusOr<Value> ToFloat(const Value& v, const Args& args) {
  const Value* fallback = args.Get(0, "default");
  const Value def = fallback ? *fallback : Value::Float(0);
  if (v.is_number()) return Value::Float(v.f());
  if (v.is_string() && !HasHex(v.str())) {
    const std::string s = PyStrip(v.str(), nullptr, true, true);
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size()) return Value::Float(d);
  }
  return def;
}

absl::StatusOr<Value> SortFilter(const Value& seq, const Args& args) {
  auto items = Iterate(seq);
  if (!items.ok()) return items.status();
  const bool reverse = BoolArg(args, 0, "reverse", false);
  const Value* attr = args.Get(2, "attribute");
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : *items) {
    Value key = item;
    if (attr) {
      auto got = AttrPath(item, attr->Str());
      if (!got.ok()) return got.status();
      key = *got;
    }
    if (key.is_string()) key = Value::String(PyLower(key.str()));  // case_sensitive=False
    keyed.emplace_back(key, item);
  }
  absl::Status error;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    auto r = reverse ? Less(b.first, a.first) : Less(a.first, b.first);
    if (!r.ok()) {
      error = r.status();
      return false;
    }
    return *r;
  });
  if (!error.ok()) return error;
  ValueList out;
  for (auto& [k, v] : keyed) out.push_back(v);
  return Value::List(std::move(out));
}

absl::StatusOr<Value> MinMax(const Value& seq, bool max) {
  auto items = Iterate(seq);
  if (!items.ok()) return items.status();
  if (items->empty()) return Value::Undefined("min/max of an empty sequence");
  Value best = (*items)[0];
  for (const Value& v : *items) {
    auto less = max ? Less(best, v) : Less(v, best);
    if (!less.ok()) return less.status();
    if (*less) best = v;
  }
  return best;
}

}  // namespace

absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& v, const Args& args,
                                  BuiltinContext& ctx) {
  if (name == "default" || name == "d") {
    const Value* fallback = args.Get(0, "default_value");
    const bool boolean = BoolArg(args, 1, "boolean", false);
    if (v.is_undefined() || (boolean && !v.Truthy()))
      return fallback ? *fallback : Value::String("");
    return v;
  }
  if (name == "length" || name == "count") {
    auto n = Length(v);
    if (!n.ok()) return n.status();
    return Value::Int(*n);
  }
  if (name == "tojson") {
    // HF's tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
    JsonOptions o;
    o.ensure_ascii = BoolArg(args, 0, "ensure_ascii", false);
    const Value* indent = args.Get(1, "indent");
    if (indent && indent->is_number()) {
      o.indent = static_cast<int>(std::clamp<int64_t>(indent->i(), 0, 64));
    }
    const Value* seps = args.Get(2, "separators");
    if (seps && !seps->is_none()) {
      if (!seps->is_list() || seps->list().size() != 2 || !seps->list()[0].is_string() ||
          !seps->list()[1].is_string()) {
        return TypeError("tojson: separators must be a pair of strings");
      }
      o.item_sep = seps->list()[0].str();
      o.key_sep = seps->list()[1].str();
    }
    o.sort_keys = BoolArg(args, 3, "sort_keys", false);
    auto json = ToJson(v, o, static_cast<size_t>(ctx.budget->max_bytes()));
    if (!json.ok()) return json.status();
    if (auto st = ctx.budget->Size(static_cast<int64_t>(json->size())); !st.ok()) return st;
    return Value::String(std::move(*json));
  }
  if (name == "first" || name == "last") {
    auto items = Iterate(v);
    if (!items.ok()) return items.status();
    if (items->empty()) return Value::Undefined(absl::StrCat("no ", name, " item"));
    return name == "first" ? items->front() : items->back();
  }
  if (name == "list") {
    auto items = Iterate(v);
    if (!items.ok()) return items.status();
    return Value::List(std::move(*items));
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::List({});
    if (v.kind() != Value::Kind::kDict) return TypeError("items: expected a mapping");
    return CallMethod(v, "items", {}, ctx);
  }
  if (name == "join") {
    auto items = Iterate(v);
    if (!items.ok()) return items.status();
    const Value* sep = args.Get(0, "d");
    const Value* attr = args.Get(1, "attribute");
    std::string out;
    for (size_t k = 0; k < items->size(); ++k) {
      const size_t limit = static_cast<size_t>(ctx.budget->max_bytes());
      if (k && sep) out += sep->Str(limit);
      if (attr) {
        auto got = AttrPath((*items)[k], attr->Str());
        if (!got.ok()) return got.status();
        out += got->Str(limit);
      } else {
        out += (*items)[k].Str(limit);
      }
      if (auto st = ctx.budget->Size(static_cast<int64_t>(out.size())); !st.ok()) return st;
    }
    return Value::String(std::move(out));
  }
  if (name == "selectattr" || name == "rejectattr") {
    return SelectOrReject(v, args, true, name == "selectattr");
  }
  if (name == "select" || name == "reject") return SelectOrReject(v, args, false, name == "select");
  if (name == "map") return MapFilter(v, args, ctx);
  if (name == "sort") return SortFilter(v, args);
  if (name == "min" || name == "max") return MinMax(v, name == "max");
  if (name == "reverse") {
    if (v.is_string()) {
      std::vector<uint32_t> cps = DecodeUtf8(v.str());
      std::reverse(cps.begin(), cps.end());
      return Value::String(EncodeUtf8(cps, 0, cps.size()));
    }
    auto items = Iterate(v);
    if (!items.ok()) return items.status();
    std::reverse(items->begin(), items->end());
    return Value::List(std::move(*items));
  }
  if (name == "unique") {
    auto items = Iterate(v);
    if (!items.ok()) return items.status();
    ValueList out;
    for (const Value& item : *items) {
      bool seen = false;
      for (const Value& o : out) {
        if (Equal(o, item) ||
            (o.is_string() && item.is_string() && PyLower(o.str()) == PyLower(item.str()))) {
          seen = true;
        }
      }
      if (!seen) out.push_back(item);
    }
    return Value::List(std::move(out));
  }
  if (name == "sum") {
    auto items = Iterate(v);
    if (!items.ok()) return items.status();
    Value total = Value::Int(0);
    for (const Value& item : *items) {
      if (!item.is_number()) return TypeError("sum: items must be numbers");
      if (total.kind() == Value::Kind::kFloat || item.kind() == Value::Kind::kFloat) {
        total = Value::Float(total.f() + item.f());
      } else {
        total = Value::Int(total.i() + item.i());
      }
    }
    return total;
  }
  if (name == "abs") {
    if (v.kind() == Value::Kind::kFloat) return Value::Float(std::fabs(v.f()));
    if (v.is_number()) return Value::Int(std::llabs(v.i()));
    return TypeError(absl::StrCat("bad operand type for abs(): '", v.TypeName(), "'"));
  }
  if (name == "int") return ToInt(v, args);
  if (name == "float") return ToFloat(v, args);
  if (name == "round") {
    if (!v.is_number()) return TypeError("round: expected a number");
    const int64_t precision = std::clamp<int64_t>(IntArg(args, 0, "precision", 0), 0, 15);
    const Value* method = args.Get(1, "method");
    if (!method || method->Str() == "common") {
      if (v.kind() != Value::Kind::kFloat) return Value::Int(v.i());  // round(int) is that int
      // Python's round(x, n): the exact binary value correctly rounded to n decimals, ties to
      // even, which is what printf does.
      char buf[512];
      std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(precision), v.f());
      return Value::Float(std::strtod(buf, nullptr));
    }
    const double scale = std::pow(10.0, static_cast<double>(precision));
    const double x = v.f() * scale;
    const double r = method->Str() == "ceil" ? std::ceil(x) : std::floor(x);
    return Value::Float(r / scale);
  }
  if (name == "safe") return v;
  // String filters: their subject is str(v).
  const std::string s = v.Str(static_cast<size_t>(ctx.budget->max_bytes()));
  if (auto st = ctx.budget->Size(static_cast<int64_t>(s.size())); !st.ok()) return st;
  if (name == "string") return Value::String(s);
  if (name == "trim") {
    const Value* chars = args.Get(0, "chars");
    return Value::String(
        PyStrip(s, chars && chars->is_string() ? &chars->str() : nullptr, true, true));
  }
  if (name == "upper") return Value::String(PyUpper(s));
  if (name == "lower") return Value::String(PyLower(s));
  if (name == "title") return Value::String(JinjaTitle(s));
  if (name == "capitalize") return Value::String(PyCapitalize(s));
  if (name == "replace") return CallMethod(Value::String(s), "replace", args, ctx);
  if (name == "indent") return Indent(s, args);
  return TypeError(absl::StrCat("no filter named '", name, "'"));
}

}  // namespace heavykv::jinja
