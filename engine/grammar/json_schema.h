// JSON Schema -> Grammar (engine/grammar/grammar.h): OpenAI's response_format json_schema,
// llama.cpp's json_schema, vLLM's structured_outputs.json, tool arguments, and "any JSON".
//
//   GrammarBuilder b;
//   absl::StatusOr<GrammarBuilder::Expr> v = CompileJsonSchema(b, schema_json, {});
//   RuleId root = b.DeclareRule("root"); b.DefineRule(root, *v);
//   absl::StatusOr<Grammar> g = std::move(b).Build(root);
//
// The contract (docs/ARCHITECTURE.md "Structured outputs"): the grammar accepts exactly the
// JSON texts that validate against the schema, written as json.dumps writes them or more
// compactly (see JsonWhitespace), or the compile fails. It may accept fewer valid instances
// than the schema allows only where stated below; it never accepts an invalid one.
// Keywords that do not change validity (title, description, $comment, examples, default,
// deprecated, readOnly, writeOnly, $schema, $id, $anchor, contentMediaType, ...) are ignored.
// An assertion keyword that cannot be compiled exactly fails with INVALID_ARGUMENT (with the
// status's payload "param" set to the JSON pointer of the keyword, e.g.
// "/properties/a/patternProperties") whose message names the keyword and that path.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/grammar/grammar.h"

namespace heavykv::grammar {

struct JsonSchemaOptions {
  // Whitespace allowed between tokens: after ',' and ':', and around brackets. The grammar
  // always accepts the compact form and json.dumps' form (", " and ": "); `pretty` also lets a
  // model write newlines and indentation (bounded: at most 20 spaces/tabs after a newline).
  bool pretty = true;
  // Properties in the order the schema lists them (OpenAI strict mode and xgrammar's default);
  // false: any order, each at most once (costly for many optional properties).
  bool ordered_properties = false;
  // OpenAI's "strict": additionalProperties defaults to false when unset.
  bool strict = false;
  // A compile running longer fails with RESOURCE_EXHAUSTED (the builder's GrammarLimits bound
  // its size; this bounds the schema walk, merges and enum checks).
  int64_t max_compile_ms = 2000;
};

// `schema` is JSON text ("{}" or "true": any JSON value). The returned Expr matches one JSON
// value (no surrounding whitespace).
absl::StatusOr<GrammarBuilder::Expr> CompileJsonSchema(GrammarBuilder& b, std::string_view schema,
                                                       const JsonSchemaOptions& options);

// Any JSON value (json_object's body when it is an object: AnyJsonObject).
GrammarBuilder::Expr AnyJsonValue(GrammarBuilder& b, const JsonSchemaOptions& options);
GrammarBuilder::Expr AnyJsonObject(GrammarBuilder& b, const JsonSchemaOptions& options);

}  // namespace heavykv::grammar
