// TEMPORARY (removed when the compilers land on main): the compilers being written on their
// branches, refusing every input so main links meanwhile.
#include "engine/grammar/gbnf.h"
#include "engine/grammar/json_schema.h"
#include "engine/grammar/regex.h"
#include "engine/grammar/tool_grammar.h"

namespace heavykv::grammar {

absl::StatusOr<GrammarBuilder::Expr> CompileToolCalls(GrammarBuilder&, std::string_view,
                                                      const JsonSchemaOptions&) {
  return absl::UnimplementedError("tool calls: not merged yet");
}

}  // namespace heavykv::grammar
