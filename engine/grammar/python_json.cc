#include "engine/grammar/python_json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <string_view>

namespace heavykv::grammar {
namespace {

void AppendString(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
}

void Append(const nlohmann::ordered_json& v, std::string& out) {
  switch (v.type()) {
    case nlohmann::ordered_json::value_t::null:
      out += "null";
      break;
    case nlohmann::ordered_json::value_t::boolean:
      out += v.get<bool>() ? "true" : "false";
      break;
    case nlohmann::ordered_json::value_t::number_integer:
      out += std::to_string(v.get<int64_t>());
      break;
    case nlohmann::ordered_json::value_t::number_unsigned:
      out += std::to_string(v.get<uint64_t>());
      break;
    case nlohmann::ordered_json::value_t::number_float:
      out += PythonFloatRepr(v.get<double>());
      break;
    case nlohmann::ordered_json::value_t::string:
      AppendString(v.get_ref<const std::string&>(), out);
      break;
    case nlohmann::ordered_json::value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& e : v) {
        if (!first) out += ", ";
        first = false;
        Append(e, out);
      }
      out += ']';
      break;
    }
    case nlohmann::ordered_json::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [k, e] : v.items()) {
        if (!first) out += ", ";
        first = false;
        AppendString(k, out);
        out += ": ";
        Append(e, out);
      }
      out += '}';
      break;
    }
    default:
      out += "null";
  }
}

}  // namespace

std::string PythonFloatRepr(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  // The shortest digits that round-trip, in scientific form: [-]d[.ddd]e[+-]XX.
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string_view sci(buf, size_t(r.ptr - buf));
  const bool negative = sci.front() == '-';
  if (negative) sci.remove_prefix(1);
  const size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e)) {
    if (c != '.') digits += c;
  }
  const int exp = std::stoi(std::string(sci.substr(e + 1)));
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out = negative ? "-" : "";
  if (exp >= -4 && exp < 16) {  // repr's fixed-point range
    if (exp >= 0) {
      std::string intpart = digits.substr(0, std::min(digits.size(), size_t(exp) + 1));
      while (intpart.size() < size_t(exp) + 1) intpart += '0';
      std::string frac = digits.size() > size_t(exp) + 1 ? digits.substr(size_t(exp) + 1) : "0";
      out += intpart + "." + frac;
    } else {
      out += "0." + std::string(size_t(-exp - 1), '0') + digits;
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return out + ebuf;
}

std::string PythonJsonDumps(const nlohmann::ordered_json& value) {
  std::string out;
  Append(value, out);
  return out;
}

}  // namespace heavykv::grammar
