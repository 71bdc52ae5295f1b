// Tool calls -> Grammar: the grammar of a ConstraintSpec of kind kToolCalls, whose text is the
// ToolCallGrammar JSON that engine/chat/tool_calls.h writes (the call format and the tools).
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/json_schema.h"

namespace heavykv::grammar {

absl::StatusOr<GrammarBuilder::Expr> CompileToolCalls(GrammarBuilder& b, std::string_view spec_json,
                                                      const JsonSchemaOptions& options);

}  // namespace heavykv::grammar
