// Python's binary operators and slicing for the chat-template interpreter
// (engine/chat/chat_template.h).
#include "engine/chat/chat_template_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace heavykv::jinja {

absl::StatusOr<Value> SliceOf(const Value& obj, const int64_t bounds[3], const bool given[3],
                              Budget* budget) {
  if (obj.is_undefined()) return UndefinedError(obj);
  std::vector<uint32_t> cps;
  int64_t n;
  if (obj.is_string()) {
    cps = DecodeUtf8(obj.str());
    n = static_cast<int64_t>(cps.size());
  } else if (obj.is_list()) {
    n = static_cast<int64_t>(obj.list().size());
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("'", obj.TypeName(), "' object is not subscriptable"));
  }
  const int64_t step = bounds[2];
  if (step == 0) return absl::InvalidArgumentError("slice step cannot be zero");
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](int64_t v, bool has, int64_t dflt) {
    if (!has) return dflt;
    if (v < 0) {
      v += n;
      if (v < 0) v = step < 0 ? -1 : 0;
    } else if (v >= n) {
      v = step < 0 ? n - 1 : n;
    }
    return v;
  };
  const int64_t start = adjust(bounds[0], given[0], step < 0 ? n - 1 : 0);
  const int64_t stop = adjust(bounds[1], given[1], step < 0 ? -1 : n);
  std::vector<size_t> picks;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    picks.push_back(static_cast<size_t>(i));
  }
  if (auto s = obj.is_string() ? budget->Size(static_cast<int64_t>(picks.size()))
                               : budget->Items(static_cast<int64_t>(picks.size()));
      !s.ok()) {
    return s;
  }
  if (obj.is_string()) {
    std::string out;
    for (size_t i : picks) AppendUtf8(cps[i], &out);
    return Value::String(std::move(out));
  }
  ValueList out;
  for (size_t i : picks) out.push_back(obj.list()[i]);
  return Value::List(std::move(out), obj.is_tuple());
}

absl::StatusOr<Value> BinaryOp(const std::string& op, const Value& a, const Value& b,
                               Budget* budget) {
  if (op == "~") {
    const std::string left = a.Str(static_cast<size_t>(budget->max_bytes()));
    const std::string right = b.Str(static_cast<size_t>(budget->max_bytes()));
    if (auto s = budget->Size(static_cast<int64_t>(left.size() + right.size())); !s.ok()) {
      return s;
    }
    return Value::String(left + right);
  }
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  auto type_error = [&]() {
    return absl::InvalidArgumentError(absl::StrCat("unsupported operand type(s) for ", op, ": '",
                                                   a.TypeName(), "' and '", b.TypeName(), "'"));
  };
  if (op == "+" && a.is_string() && b.is_string()) {
    if (auto s = budget->Size(static_cast<int64_t>(a.str().size() + b.str().size())); !s.ok()) {
      return s;
    }
    return Value::String(a.str() + b.str());
  }
  if (op == "+" && a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    if (auto s = budget->Items(static_cast<int64_t>(a.list().size() + b.list().size())); !s.ok()) {
      return s;
    }
    ValueList items = a.list();
    items.insert(items.end(), b.list().begin(), b.list().end());
    return Value::List(std::move(items), a.is_tuple());
  }
  if (op == "*" && (a.is_string() || a.is_list() || b.is_string() || b.is_list())) {
    const Value& seq = a.is_number() ? b : a;
    const Value& times = a.is_number() ? a : b;
    if (!times.is_number() || times.kind() == Value::Kind::kFloat) return type_error();
    const int64_t n = std::max<int64_t>(0, times.i());
    const int64_t unit = seq.is_string()
                             ? static_cast<int64_t>(seq.str().size())
                             : static_cast<int64_t>(seq.is_list() ? seq.list().size() : 0);
    if (!seq.is_string() && !seq.is_list()) return type_error();
    if (unit > 0 && n > budget->max_bytes() / unit + 1)
      return budget->Size(budget->max_bytes() + 1);
    if (auto s = seq.is_string() ? budget->Size(unit * n) : budget->Items(unit * n); !s.ok()) {
      return s;
    }
    if (seq.is_string()) {
      std::string out;
      for (int64_t k = 0; k < n; ++k) out += seq.str();
      return Value::String(std::move(out));
    }
    ValueList items;
    for (int64_t k = 0; k < n; ++k) items.insert(items.end(), seq.list().begin(), seq.list().end());
    return Value::List(std::move(items), seq.is_tuple());
  }
  if (!a.is_number() || !b.is_number()) return type_error();
  const bool floats = a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat;
  if (op == "/") {
    if (b.f() == 0) return absl::InvalidArgumentError("division by zero");
    return Value::Float(a.f() / b.f());
  }
  if (floats) {
    const double x = a.f(), y = b.f();
    if (op == "+") return Value::Float(x + y);
    if (op == "-") return Value::Float(x - y);
    if (op == "*") return Value::Float(x * y);
    if (op == "**") return Value::Float(std::pow(x, y));
    if (y == 0) return absl::InvalidArgumentError("float division by zero");
    if (op == "//") return Value::Float(std::floor(x / y));
    if (op == "%") {
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value::Float(m);
    }
    return type_error();
  }
  const int64_t x = a.i(), y = b.i();
  int64_t r = 0;
  bool overflow = false;
  if (op == "+") {
    overflow = __builtin_add_overflow(x, y, &r);
  } else if (op == "-") {
    overflow = __builtin_sub_overflow(x, y, &r);
  } else if (op == "*") {
    overflow = __builtin_mul_overflow(x, y, &r);
  } else if (op == "//" || op == "%") {
    if (y == 0) return absl::InvalidArgumentError("integer division or modulo by zero");
    if (x == std::numeric_limits<int64_t>::min() && y == -1) {
      overflow = true;
    } else {
      int64_t q = x / y;
      int64_t m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      r = op == "//" ? q : m;
    }
  } else if (op == "**") {
    if (y < 0) return Value::Float(std::pow(static_cast<double>(x), static_cast<double>(y)));
    r = 1;
    for (int64_t k = 0; k < y && !overflow; ++k) {
      overflow = __builtin_mul_overflow(r, x, &r);
      if (r == 0 || r == 1) break;
    }
    if (!overflow && x == -1) r = (y % 2) ? -1 : 1;
  } else {
    return type_error();
  }
  if (overflow) return absl::InvalidArgumentError("integer overflow (past 64 bits)");
  return Value::Int(r);
}

}  // namespace heavykv::jinja
