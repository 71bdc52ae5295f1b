// ConstraintSpec: what a request asks its output to match (docs/ARCHITECTURE.md "Structured
// outputs"). The fronts fill it from the API fields (response_format, json_schema, grammar,
// structured_outputs, tools with tool_choice, the gRPC `constraint` oneof); the engine compiles
// it (engine/grammar/constraint.h) on the caller's thread, cached by (spec, vocabulary).
#pragma once

#include <string>
#include <vector>

namespace heavykv::grammar {

struct ConstraintSpec {
  enum class Kind {
    kNone,
    kJsonObject,  // any JSON object (response_format json_object)
    kJsonSchema,  // `text`: a JSON Schema
    kRegex,       // `text`: a regular expression, matched in full
    kChoice,      // `choices`: exactly one of these strings
    kGbnf,        // `text`: a GBNF grammar whose start rule is "root"
    kToolCalls,   // `text`: ToolCallGrammar JSON (engine/chat/tool_calls.h writes it)
  };
  Kind kind = Kind::kNone;
  std::string text;
  std::vector<std::string> choices;
  // OpenAI's json_schema.strict: additionalProperties false unless the schema says otherwise.
  bool strict = false;
  // A lazy constraint: the output is free until one of these strings appears in it (a tool
  // call's opening tag with tool_choice "auto"; "</think>" after a model's reasoning); the text
  // after the trigger must then match. `trigger_in_grammar`: the trigger itself is the start of
  // what the grammar matches (kept in its input), else only what follows it is.
  std::vector<std::string> triggers;
  bool trigger_in_grammar = false;
  // A reasoning model (Qwen3's `<think>`) may think first: the output may open with
  // "<think>" + any text without "</think>" + "</think>" and white space, and the constraint
  // holds from there (a lazy one looks for its trigger only after the reasoning).
  bool optional_reasoning = false;

  bool active() const { return kind != Kind::kNone; }
  // A stable text of the whole spec: the compile cache's key.
  std::string CacheKey() const;
  // What the fronts name in logs and errors: "json_schema", "regex", ...
  const char* KindName() const;
};

}  // namespace heavykv::grammar
