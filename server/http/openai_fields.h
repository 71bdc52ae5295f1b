// Fields: typed reads of a JSON request body's fields for the OpenAI front's parsers
// (openai_json.cc, openai_sampling.cc). Absent and null read as unset; a value of the wrong type
// records the first error (INVALID_ARGUMENT naming the field, WithParam) and reads as unset, so a
// parser reads every field and returns status() once.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "server/http/http_status.h"

namespace heavykv::server {

class Fields {
 public:
  using Json = nlohmann::ordered_json;

  explicit Fields(const Json& object) : object_(object) {}

  const Json* Get(const char* key) const {
    const auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }

  std::optional<bool> Bool(const char* key) {
    const Json* v = Get(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean()) return Fail(key, "must be true or false"), std::nullopt;
    return v->get<bool>();
  }
  std::optional<std::string> String(const char* key) {
    const Json* v = Get(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) return Fail(key, "must be a string"), std::nullopt;
    return v->get<std::string>();
  }
  std::optional<double> Number(const char* key) {
    const Json* v = Get(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) return Fail(key, "must be a number"), std::nullopt;
    return v->get<double>();
  }
  // An integer in [lo, hi] (a float with no fraction counts, as pydantic reads it).
  std::optional<int64_t> Int(const char* key, int64_t lo, int64_t hi) {
    const Json* v = Get(key);
    if (v == nullptr) return std::nullopt;
    std::optional<int64_t> i = AsInt(*v, lo, hi);
    if (!i) Fail(key, absl::StrCat("must be an integer in [", lo, ", ", hi, "]"));
    return i;
  }
  std::vector<int32_t> Ints(const char* key, int64_t lo, int64_t hi) {
    std::vector<int32_t> out;
    const Json* v = Get(key);
    if (v == nullptr) return out;
    if (!v->is_array()) return Fail(key, "must be a list of integers"), out;
    for (const Json& e : *v) {
      std::optional<int64_t> i = AsInt(e, lo, hi);
      if (!i) {
        Fail(key, absl::StrCat("must hold integers in [", lo, ", ", hi, "]"));
        return {};
      }
      out.push_back(static_cast<int32_t>(*i));
    }
    return out;
  }
  // A field heavykv does not serve: absent, null, false, 0, or empty only.
  void Unsupported(const char* key, absl::string_view why) {
    const Json* v = Get(key);
    if (v == nullptr) return;
    const bool unset = (v->is_boolean() && !v->get<bool>()) ||
                       (v->is_number() && v->get<double>() == 0) ||
                       ((v->is_array() || v->is_object() || v->is_string()) && v->empty());
    if (!unset) Fail(key, why);
  }

  void Fail(absl::string_view key, absl::string_view message) {
    if (status_.ok()) {
      status_ = WithParam(absl::InvalidArgumentError(absl::StrCat(key, " ", message)), key);
    }
  }
  const absl::Status& status() const { return status_; }

  static std::optional<int64_t> AsInt(const Json& v, int64_t lo, int64_t hi) {
    int64_t i = 0;
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > uint64_t(std::numeric_limits<int64_t>::max())) return std::nullopt;
      i = int64_t(u);
    } else if (v.is_number_integer()) {
      i = v.get<int64_t>();
    } else if (v.is_number_float()) {
      const double d = v.get<double>();
      if (!(d == std::floor(d) && std::abs(d) < 9e15)) return std::nullopt;
      i = int64_t(d);
    } else {
      return std::nullopt;
    }
    if (i < lo || i > hi) return std::nullopt;
    return i;
  }

 private:
  const Json& object_;
  absl::Status status_;
};

}  // namespace heavykv::server
