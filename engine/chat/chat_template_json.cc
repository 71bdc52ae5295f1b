#include "engine/chat/chat_template_json.h"

#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace heavykv::jinja {
namespace {

using Json = nlohmann::ordered_json;  // keeps the key order, as json.loads does

constexpr int kMaxJsonDepth = 256;

absl::StatusOr<Value> FromJson(const Json& j, int depth) {
  if (depth > kMaxJsonDepth) return absl::InvalidArgumentError("JSON nests too deep");
  switch (j.type()) {
    case Json::value_t::null:
      return Value::None();
    case Json::value_t::boolean:
      return Value::Bool(j.get<bool>());
    case Json::value_t::number_integer:
      return Value::Int(j.get<int64_t>());
    case Json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > uint64_t(std::numeric_limits<int64_t>::max())) return Value::Float(double(u));
      return Value::Int(int64_t(u));
    }
    case Json::value_t::number_float:
      return Value::Float(j.get<double>());
    case Json::value_t::string:
      return Value::String(j.get<std::string>());
    case Json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const Json& e : j) {
        absl::StatusOr<Value> v = FromJson(e, depth + 1);
        if (!v.ok()) return v.status();
        items.push_back(*std::move(v));
      }
      return Value::List(std::move(items));
    }
    case Json::value_t::object: {
      ValueDict items;
      items.reserve(j.size());
      for (const auto& [k, e] : j.items()) {
        absl::StatusOr<Value> v = FromJson(e, depth + 1);
        if (!v.ok()) return v.status();
        items.emplace_back(Value::String(k), *std::move(v));
      }
      return Value::Dict(std::move(items));
    }
    default:
      return absl::InvalidArgumentError("binary JSON values are not served");
  }
}

Value Str(std::string s) { return Value::String(std::move(s)); }

}  // namespace

absl::StatusOr<Value> ValueFromJson(std::string_view text, std::string_view what) {
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), " is not valid JSON"));
  }
  absl::StatusOr<Value> v = FromJson(j, 0);
  if (!v.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": ", v.status().message()));
  }
  return v;
}

absl::StatusOr<Value> MessagesValue(const std::vector<ChatMessage>& messages) {
  ValueList list;
  list.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    ValueDict d = {{Str("role"), Str(m.role)},
                   {Str("content"), m.content_null ? Value::None() : Str(m.content)}};
    if (!m.tool_calls.empty()) {
      ValueList calls;
      for (size_t k = 0; k < m.tool_calls.size(); ++k) {
        const ChatToolCall& c = m.tool_calls[k];
        Value arguments = Value::Dict({});
        if (!c.arguments.empty()) {
          absl::StatusOr<Value> a = ValueFromJson(
              c.arguments,
              absl::StrCat("messages[", i, "].tool_calls[", k, "].function.arguments"));
          if (!a.ok()) return a.status();
          if (!a->is_dict()) {
            return absl::InvalidArgumentError(absl::StrCat(
                "messages[", i, "].tool_calls[", k, "].function.arguments is not a JSON object"));
          }
          arguments = *std::move(a);
        }
        calls.push_back(Value::Dict(
            {{Str("id"), Str(c.id)},
             {Str("type"), Str(c.type)},
             {Str("function"),
              Value::Dict({{Str("name"), Str(c.name)}, {Str("arguments"), arguments}})}}));
      }
      d.emplace_back(Str("tool_calls"), Value::List(std::move(calls)));
    }
    if (m.tool_call_id) d.emplace_back(Str("tool_call_id"), Str(*m.tool_call_id));
    if (m.name) d.emplace_back(Str("name"), Str(*m.name));
    if (m.reasoning_content) d.emplace_back(Str("reasoning_content"), Str(*m.reasoning_content));
    list.push_back(Value::Dict(std::move(d)));
  }
  return Value::List(std::move(list));
}

}  // namespace heavykv::jinja
