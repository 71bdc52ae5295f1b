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
// compactly (see JsonSchemaOptions::pretty), or the compile fails. It may accept fewer valid
// instances than the schema allows only where stated below; it never accepts an invalid one.
// "Validate" means as Python's jsonschema does with its FormatChecker (the validator of the
// real-world benchmarks), for the draft the schema's $schema names (2020-12 when none).
// Keywords that do not change validity (title, description, $comment, examples, default,
// deprecated, readOnly, writeOnly, $schema, $id, $anchor, contentMediaType, unknown ones, and
// OpenAPI's `nullable`, which jsonschema ignores too) are ignored. An assertion keyword that
// cannot be compiled exactly fails with INVALID_ARGUMENT whose message names the keyword and its
// JSON pointer, which is also the status's payload kSchemaParamPayload (json_schema_set.h; the
// key the HTTP front reads as the error's "param"). Past a limit: RESOURCE_EXHAUSTED naming it.
//
// Fewer valid instances than allowed (never more):
//  - Text forms: keys, enum/const strings and pattern/format strings only as json.dumps writes
//    them (no \u escape for a printable character); numbers under bounds in fixed notation
//    (exponents only where every number of that form is in range); integers as integers or
//    with one zero, as Python writes an integral float ("3.0"; draft 4: integers only).
//  - Objects: up to 8 listed properties in any order, each at most once; more in any order
//    with the keys that required, dependencies or key conditions name tracked (up to 8) and a
//    key allowed to repeat (harmless: each occurrence's value passes the key's schema and the
//    parser keeps one); past that, in the schema's order.
//  - Formats jsonschema checks are compiled as strict subsets (date, time, date-time, uuid,
//    ipv4, ipv6, hostname, email, uri and friends as scheme://..., duration, json-pointer);
//    the other checked formats (regex, uri-template, idn-*, color, ...) refuse; unchecked ones
//    (int32, byte, ...) are annotations.
//  - pattern: Python's re and ECMA-262 where they agree (json_string_regex.h).
//  - allOf and $ref beside other keywords are merged (stricter than draft 7's ignored siblings).
//  - oneOf of objects told apart by required keys ({properties, required} branches): every
//    branch's property schemas apply to every key present; exactly one branch's keys present.
// Refused: other oneOf whose branches may overlap, not (but of types and of required keys),
// if/then/else (but boolean if), uniqueItems (but at most one item), contains (but trivial),
// remote $ref, $dynamicRef, dependentSchemas, propertyNames beside listed properties,
// multipleOf but integers 1..100 without bounds, patternProperties matching a listed key with
// additionalProperties false, minProperties past 1 / maxProperties where keys are open.
// Enum and const values are checked against the whole schema instead (any keyword above).
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
