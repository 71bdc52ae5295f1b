#include "server/http/openai_constraint.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/http/http_status.h"

namespace heavykv::server {
namespace {

// Ordered: a schema's properties keep the order the client wrote them in.
using json = nlohmann::ordered_json;
using Kind = grammar::ConstraintSpec::Kind;

absl::Status Invalid(const std::string& param, absl::string_view message) {
  return WithParam(absl::InvalidArgumentError(absl::StrCat(param, " ", message)), param);
}

// A schema given as an object (or true/false), or as JSON text (vLLM accepts both).
absl::Status SchemaText(const json& v, const std::string& param, std::string& out) {
  if (v.is_object() || v.is_boolean()) {
    out = v.dump(-1, ' ', false, json::error_handler_t::replace);
    return absl::OkStatus();
  }
  if (v.is_string()) {
    const std::string text = v.get<std::string>();
    if (!json::accept(text)) return Invalid(param, "is a string that is not valid JSON");
    out = text;
    return absl::OkStatus();
  }
  return Invalid(param, "must be a JSON Schema (an object)");
}

absl::Status ChoiceList(const json& v, const std::string& param, std::vector<std::string>& out) {
  if (!v.is_array() || v.empty()) return Invalid(param, "must be a non-empty list of strings");
  for (const json& c : v) {
    if (!c.is_string()) return Invalid(param, "must be a non-empty list of strings");
    out.push_back(c.get<std::string>());
  }
  return absl::OkStatus();
}

absl::Status Text(const json& v, const std::string& param, std::string& out) {
  if (!v.is_string() || v.get<std::string>().empty()) {
    return Invalid(param, "must be a non-empty string");
  }
  out = v.get<std::string>();
  return absl::OkStatus();
}

absl::Status ResponseFormat(const json& v, grammar::ConstraintSpec& spec) {
  if (!v.is_object()) return Invalid("response_format", "must be an object {type, ...}");
  const auto type = v.find("type");
  if (type == v.end() || !type->is_string()) {
    return Invalid("response_format.type", "must be text, json_object or json_schema");
  }
  const std::string t = type->get<std::string>();
  if (t == "text") return absl::OkStatus();
  if (t == "json_object") {
    if (const auto schema = v.find("schema"); schema != v.end() && !schema->is_null()) {
      spec.kind = Kind::kJsonSchema;
      return SchemaText(*schema, "response_format.schema", spec.text);
    }
    spec.kind = Kind::kJsonObject;
    return absl::OkStatus();
  }
  if (t == "json_schema") {
    const auto js = v.find("json_schema");
    if (js == v.end() || !js->is_object()) {
      return Invalid("response_format.json_schema", "must be an object {name, schema, strict}");
    }
    if (const auto name = js->find("name"); name != js->end() && !name->is_string()) {
      return Invalid("response_format.json_schema.name", "must be a string");
    }
    if (const auto strict = js->find("strict"); strict != js->end() && !strict->is_null()) {
      if (!strict->is_boolean()) {
        return Invalid("response_format.json_schema.strict", "must be true or false");
      }
      spec.strict = strict->get<bool>();
    }
    spec.kind = Kind::kJsonSchema;
    const auto schema = js->find("schema");
    if (schema == js->end() || schema->is_null()) {  // no schema: any JSON value
      spec.text = "{}";
      return absl::OkStatus();
    }
    return SchemaText(*schema, "response_format.json_schema.schema", spec.text);
  }
  return Invalid("response_format.type",
                 absl::StrCat("`", t.substr(0, 64), "` is not served: send text, json_object or "
                              "json_schema"));
}

// vLLM's structured_outputs object: exactly one of its constraint keys.
absl::Status StructuredOutputs(const json& v, grammar::ConstraintSpec& spec, std::string& param) {
  if (!v.is_object()) return Invalid("structured_outputs", "must be an object");
  int set = 0;
  for (const auto& [key, value] : v.items()) {
    if (value.is_null() || (value.is_boolean() && !value.get<bool>())) continue;
    const std::string p = "structured_outputs." + key;
    absl::Status s;
    if (key == "json") {
      spec.kind = Kind::kJsonSchema;
      s = SchemaText(value, p, spec.text);
    } else if (key == "regex") {
      spec.kind = Kind::kRegex;
      s = Text(value, p, spec.text);
    } else if (key == "choice") {
      spec.kind = Kind::kChoice;
      s = ChoiceList(value, p, spec.choices);
    } else if (key == "grammar") {
      spec.kind = Kind::kGbnf;
      s = Text(value, p, spec.text);
    } else if (key == "json_object") {
      if (!value.is_boolean()) return Invalid(p, "must be true or false");
      spec.kind = Kind::kJsonObject;
    } else if (key == "disable_any_whitespace" || key == "disable_additional_properties" ||
               key == "whitespace_pattern" || key == "structural_tag") {
      return Invalid(p, "is not served: leave it out");
    } else if (key == "disable_fallback") {
      continue;  // heavykv has one backend: nothing to fall back from
    } else {
      return Invalid(p, "is not a structured_outputs field (json, regex, choice, grammar, "
                        "json_object)");
    }
    if (!s.ok()) return s;
    param = p;
    ++set;
  }
  if (set > 1) {
    return Invalid("structured_outputs", "must hold one of json, regex, choice, grammar, "
                                         "json_object");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadConstraintFields(const json& body, grammar::ConstraintSpec& spec,
                                  std::string& param) {
  spec = grammar::ConstraintSpec();
  param.clear();
  std::string first;  // the field of the constraint found first
  const auto take = [&](const char* key, const auto& read) -> absl::Status {
    const auto it = body.find(key);
    if (it == body.end() || it->is_null()) return absl::OkStatus();
    grammar::ConstraintSpec one;
    std::string p = key;
    if (absl::Status s = read(*it, one, p); !s.ok()) return s;
    if (!one.active()) return absl::OkStatus();
    if (spec.active()) {
      return Invalid(key, absl::StrCat("and ", first, " both constrain the output: send one"));
    }
    spec = std::move(one);
    first = key;
    param = p;
    return absl::OkStatus();
  };
  using Spec = grammar::ConstraintSpec;
  const auto schema = [](const json& v, Spec& out, std::string& p) {
    out.kind = Kind::kJsonSchema;
    return SchemaText(v, p, out.text);
  };
  absl::Status s = take("response_format", [](const json& v, Spec& out, std::string&) {
    return ResponseFormat(v, out);
  });
  if (s.ok()) s = take("json_schema", schema);
  if (s.ok()) s = take("guided_json", schema);
  if (s.ok()) {
    s = take("grammar", [](const json& v, Spec& out, std::string& p) {
      out.kind = Kind::kGbnf;
      return Text(v, p, out.text);
    });
  }
  if (s.ok()) {
    s = take("guided_grammar", [](const json& v, Spec& out, std::string& p) {
      out.kind = Kind::kGbnf;
      return Text(v, p, out.text);
    });
  }
  if (s.ok()) {
    s = take("guided_regex", [](const json& v, Spec& out, std::string& p) {
      out.kind = Kind::kRegex;
      return Text(v, p, out.text);
    });
  }
  if (s.ok()) {
    s = take("guided_choice", [](const json& v, Spec& out, std::string& p) {
      out.kind = Kind::kChoice;
      return ChoiceList(v, p, out.choices);
    });
  }
  if (s.ok()) s = take("structured_outputs", StructuredOutputs);
  if (!s.ok()) return s;
  // guided_decoding_backend picks vLLM's engine and changes no output: heavykv has one.
  if (const auto it = body.find("guided_whitespace_pattern"); it != body.end() && !it->is_null()) {
    return Invalid("guided_whitespace_pattern", "is not served: leave it out");
  }
  return absl::OkStatus();
}

}  // namespace heavykv::server
