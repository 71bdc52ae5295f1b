// Tool calls -> Grammar (engine/grammar/grammar.h): ConstraintSpec kToolCalls, whose text is the
// ToolCallGrammar JSON that engine/chat/tool_calls.h writes (ToolCallGrammarJson):
//   {"format": "qwen" | "llama3" | "generic", "tools": [{"name": N, "parameters": SCHEMA}, ...],
//    "parallel": bool}
//
//   GrammarBuilder b;
//   absl::StatusOr<GrammarBuilder::Expr> e = CompileToolCalls(b, spec.text, {});
//   RuleId root = b.DeclareRule("root"); b.DefineRule(root, *e);
//
// The grammar accepts one call (or, parallel, one or more) in the format's wrapper, each
// `{"name": "<a tool's name>", "arguments": <that tool's arguments>}` with the name fixed per
// tool alternative and the arguments matching its `parameters` schema (an absent or empty schema:
// any JSON object):
//   qwen:    <tool_call>\n{"name": N, "arguments": A}\n</tool_call>   (parallel: joined by "\n")
//   llama3:  {"name": N, "parameters": A}                              (parallel: joined by "; ")
//   generic: {"name": N, "arguments": A}                    (parallel: a JSON list [C, C, ...])
// The wrapper text is exactly this (the model is steered into it); inside the arguments the
// whitespace is JsonSchemaOptions'. INVALID_ARGUMENT for a spec that is not this JSON (the param
// payload names the field, e.g. "/tools/0/name"), or a schema that does not compile (its own
// error, the path prefixed with "/tools/K/parameters").
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/json_schema.h"

namespace heavykv::grammar {

absl::StatusOr<GrammarBuilder::Expr> CompileToolCalls(GrammarBuilder& b, std::string_view spec_json,
                                                      const JsonSchemaOptions& options);

}  // namespace heavykv::grammar
