// TEMPORARY (removed when the compilers land on main): the compilers being written on their
// branches, refusing every input so main links meanwhile.
#include "engine/grammar/gbnf.h"
#include "engine/grammar/json_schema.h"
#include "engine/grammar/regex.h"

namespace heavykv::grammar {

absl::StatusOr<GrammarBuilder::Expr> CompileRegex(GrammarBuilder&, std::string_view,
                                                  const RegexOptions&) {
  return absl::UnimplementedError("regex: not merged yet");
}
absl::StatusOr<Grammar> CompileGbnf(std::string_view, std::string_view, const GrammarLimits&) {
  return absl::UnimplementedError("gbnf: not merged yet");
}
absl::StatusOr<GrammarBuilder::Expr> CompileJsonSchema(GrammarBuilder&, std::string_view,
                                                       const JsonSchemaOptions&) {
  return absl::UnimplementedError("json schema: not merged yet");
}
GrammarBuilder::Expr AnyJsonValue(GrammarBuilder& b, const JsonSchemaOptions&) {
  return b.Nothing();
}
GrammarBuilder::Expr AnyJsonObject(GrammarBuilder& b, const JsonSchemaOptions&) {
  return b.Nothing();
}

}  // namespace heavykv::grammar
