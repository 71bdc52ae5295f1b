#include "engine/grammar/tool_grammar.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace heavykv::grammar {
namespace {

using Json = nlohmann::ordered_json;  // a schema's properties keep their order

absl::Status Invalid(const std::string& path, const std::string& message) {
  absl::Status s = absl::InvalidArgumentError(absl::StrCat("tool calls: ", message));
  s.SetPayload("param", absl::Cord(path));
  return s;
}

}  // namespace

absl::StatusOr<GrammarBuilder::Expr> CompileToolCalls(GrammarBuilder& b, std::string_view spec_json,
                                                      const JsonSchemaOptions& options) {
  const Json spec = Json::parse(spec_json.begin(), spec_json.end(), nullptr, false);
  if (spec.is_discarded() || !spec.is_object()) return Invalid("", "the spec is not a JSON object");
  const auto format_it = spec.find("format");
  if (format_it == spec.end() || !format_it->is_string()) {
    return Invalid("/format", "format must be \"qwen\", \"llama3\" or \"generic\"");
  }
  const std::string format = *format_it;
  if (format != "qwen" && format != "llama3" && format != "generic") {
    return Invalid("/format", "format must be \"qwen\", \"llama3\" or \"generic\"");
  }
  const auto parallel_it = spec.find("parallel");
  const bool parallel =
      parallel_it != spec.end() && parallel_it->is_boolean() && parallel_it->get<bool>();
  const auto tools = spec.find("tools");
  if (tools == spec.end() || !tools->is_array() || tools->empty()) {
    return Invalid("/tools", "tools must be a non-empty list");
  }
  const std::string args_key = format == "llama3" ? "parameters" : "arguments";

  std::vector<GrammarBuilder::Expr> calls;
  for (size_t k = 0; k < tools->size(); ++k) {
    const Json& tool = (*tools)[k];
    const std::string where = absl::StrCat("/tools/", k);
    const auto name = tool.is_object() ? tool.find("name") : tool.end();
    if (name == tool.end() || !name->is_string() || name->get<std::string>().empty()) {
      return Invalid(where + "/name", "each tool needs a name");
    }
    const auto params = tool.find("parameters");
    GrammarBuilder::Expr arguments;
    if (params == tool.end() || params->is_null() || (params->is_object() && params->empty())) {
      arguments = AnyJsonObject(b, options);
    } else {
      absl::StatusOr<GrammarBuilder::Expr> e = CompileJsonSchema(b, params->dump(), options);
      if (!e.ok()) {
        absl::Status s = e.status();
        const std::string inner = s.GetPayload("param") ? std::string(*s.GetPayload("param")) : "";
        s.SetPayload("param", absl::Cord(absl::StrCat(where, "/parameters", inner)));
        return s;
      }
      arguments = *e;
    }
    // json.dumps' form of the name, so the literal is the JSON string the parser reads back.
    const std::string head = absl::StrCat("{\"name\": ", Json(name->get<std::string>()).dump(),
                                          ", \"", args_key, "\": ");
    calls.push_back(b.Seq({b.Literal(head), arguments, b.Literal("}")}));
  }
  const RuleId call_rule = b.DeclareRule("tool_call");
  b.DefineRule(call_rule, calls.size() == 1 ? calls[0] : b.Alt(calls));
  const auto call = [&] { return b.Ref(call_rule); };

  if (format == "qwen") {
    const RuleId block = b.DeclareRule("tool_call_block");
    b.DefineRule(block, b.Seq({b.Literal("<tool_call>\n"), call(), b.Literal("\n</tool_call>")}));
    if (!parallel) return b.Ref(block);
    return b.Seq({b.Ref(block), b.Repeat(b.Seq({b.Literal("\n"), b.Ref(block)}), 0, -1)});
  }
  if (format == "llama3") {
    if (!parallel) return call();
    return b.Seq({call(), b.Repeat(b.Seq({b.Literal("; "), call()}), 0, -1)});
  }
  if (!parallel) return call();
  return b.Seq(
      {b.Literal("["), call(), b.Repeat(b.Seq({b.Literal(", "), call()}), 0, -1), b.Literal("]")});
}

}  // namespace heavykv::grammar
