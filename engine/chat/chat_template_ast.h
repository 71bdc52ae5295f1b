// The parsed form of a chat template (engine/chat/chat_template.h): a tree of statements holding
// expression trees, built once by ParseTemplate and only read while rendering. Every node keeps
// its 1-based line and column for error messages.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/chat/chat_template_value.h"

namespace heavykv::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,   // literal
    kName,      // name
    kList,      // args: the items
    kTuple,     // args: the items
    kDict,      // args: key, value, key, value, ...
    kAttr,      // args[0].name
    kItem,      // args[0][args[1]]
    kSlice,     // args[0][args[1]:args[2]:args[3]], missing parts null
    kCall,      // args[0](args[1:], kwargs)
    kFilter,    // args[0] | name(args[1:], kwargs)
    kTest,      // args[0] is [not] name(args[1:])
    kNot,       // not args[0]
    kNeg,       // -args[0]
    kPos,       // +args[0]
    kBinary,    // args[0] name args[1]: + - * / // % ** ~
    kAnd,       // args[0] and args[1]
    kOr,        // args[0] or args[1]
    kCompare,   // args[0] ops[0] args[1] ops[1] args[2] ...: == != < <= > >= in notin
    kCondExpr,  // args[1] if args[0] else args[2] (args[2] may be null)
  };
  Kind kind = Kind::kLiteral;
  int line = 0;
  int column = 0;
  Value literal;
  std::string name;
  bool negated = false;  // kTest: `is not`
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // kCompare
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches: (condition, body); a final else has a null condition
    kFor,       // for targets in expr [if filter]: body [else: else_body]
    kSet,       // set targets = expr (one target, or several unpacked from a sequence)
    kSetAttr,   // set targets[0].attr = expr (a namespace)
    kSetBlock,  // set targets[0]: the rendered body
    kBreak,
    kContinue,
    kMacro,  // macro targets[0](targets[1:] = defaults[...]): body
  };
  Kind kind = Kind::kText;
  int line = 0;
  int column = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::string> targets;
  std::string attr;
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<ExprPtr> defaults;  // kMacro: one per parameter, null when it has none
  Body body;
  Body else_body;
};

// Lexes and parses `source` as jinja2 does with trim_blocks and lstrip_blocks (newlines
// normalized to "\n", one trailing newline dropped). INVALID_ARGUMENT naming the line and column
// for a syntax error, a construct outside the supported subset, or nesting deeper than
// `max_depth`.
absl::StatusOr<Body> ParseTemplate(std::string_view source, int max_depth);

}  // namespace heavykv::jinja
