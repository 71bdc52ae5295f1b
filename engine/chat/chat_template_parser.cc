// jinja2's grammar (jinja2/parser.py) for the statements and expressions chat templates use.
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/chat/chat_template_ast.h"
#include "engine/chat/chat_template_lexer.h"

namespace heavykv::jinja {
namespace {

using TK = Token::Kind;

class Parser {
 public:
  Parser(std::vector<Token> tokens, int max_depth)
      : tokens_(std::move(tokens)), max_depth_(max_depth) {}

  absl::StatusOr<Body> Run() {
    Body body;
    std::string end;
    if (auto s = ParseBody({}, &body, &end); !s.ok()) return s;
    return body;
  }

 private:
  const Token& Peek(size_t ahead = 0) const {
    const size_t k = std::min(pos_ + ahead, tokens_.size() - 1);
    return tokens_[k];
  }
  const Token& Next() {
    const Token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  bool IsOp(const char* op, size_t ahead = 0) const {
    return Peek(ahead).kind == TK::kOp && Peek(ahead).text == op;
  }
  bool IsName(const char* name, size_t ahead = 0) const {
    return Peek(ahead).kind == TK::kName && Peek(ahead).text == name;
  }
  bool SkipOp(const char* op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(const char* name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }

  static std::string Describe(const Token& t) {
    switch (t.kind) {
      case TK::kEof:
        return "end of template";
      case TK::kVarEnd:
        return "'}}'";
      case TK::kBlockEnd:
        return "'%}'";
      case TK::kText:
        return "template text";
      case TK::kLiteral:
        return "literal";
      default:
        return absl::StrCat("'", t.text, "'");
    }
  }
  absl::Status Error(const Token& at, const std::string& what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template line ", at.line, ", column ", at.column, ": ", what));
  }
  absl::Status Expect(TK kind, const char* what) {
    if (Peek().kind != kind) {
      return Error(Peek(), absl::StrCat("expected ", what, ", got ", Describe(Peek())));
    }
    Next();
    return absl::OkStatus();
  }
  absl::Status ExpectOp(const char* op) {
    if (!SkipOp(op)) {
      return Error(Peek(), absl::StrCat("expected '", op, "', got ", Describe(Peek())));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Peek().kind != TK::kName) {
      return Error(Peek(), absl::StrCat("expected a name, got ", Describe(Peek())));
    }
    return Next().text;
  }

  struct DepthGuard {
    explicit DepthGuard(int* d) : depth(d) { ++*depth; }
    ~DepthGuard() { --*depth; }
    int* depth;
  };
  absl::Status CheckDepth() const {
    if (depth_ > max_depth_) {
      return Error(Peek(), absl::StrCat("nesting deeper than ", max_depth_));
    }
    return absl::OkStatus();
  }

  // Statements until a `{% name %}` with name in `ends` (its name in *end, the tag's name
  // consumed, the rest of the tag not) or the end of the template (ends empty).
  absl::Status ParseBody(const std::vector<std::string>& ends, Body* body, std::string* end) {
    DepthGuard guard(&depth_);
    if (auto s = CheckDepth(); !s.ok()) return s;
    while (true) {
      const Token& t = Peek();
      if (t.kind == TK::kEof) {
        if (ends.empty()) return absl::OkStatus();
        return Error(t, absl::StrCat("unexpected end of template, expected '", ends[0], "'"));
      }
      if (t.kind == TK::kText) {
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::kText;
        node->text = t.text;
        body->push_back(std::move(node));
        Next();
        continue;
      }
      if (t.kind == TK::kVarBegin) {
        Next();
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::kOutput;
        node->line = t.line;
        node->column = t.column;
        auto e = ParseExpr();
        if (!e.ok()) return e.status();
        node->expr = std::move(*e);
        if (auto s = Expect(TK::kVarEnd, "'}}'"); !s.ok()) return s;
        body->push_back(std::move(node));
        continue;
      }
      if (t.kind != TK::kBlockBegin) return Error(t, "unexpected " + Describe(t));
      Next();
      const Token& name_tok = Peek();
      if (name_tok.kind != TK::kName) return Error(name_tok, "expected a statement name");
      for (const std::string& e : ends) {
        if (name_tok.text == e) {
          *end = e;
          Next();
          return absl::OkStatus();
        }
      }
      auto node = ParseStatement();
      if (!node.ok()) return node.status();
      body->push_back(std::move(*node));
    }
  }

  absl::StatusOr<std::unique_ptr<Node>> ParseStatement() {
    const Token t = Next();
    auto node = std::make_unique<Node>();
    node->line = t.line;
    node->column = t.column;
    if (t.text == "if") return ParseIf(std::move(node));
    if (t.text == "for") return ParseFor(std::move(node));
    if (t.text == "set") return ParseSet(std::move(node));
    if (t.text == "macro") return ParseMacro(std::move(node));
    if (t.text == "break" || t.text == "continue") {
      node->kind = t.text == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      if (loop_depth_ == 0) return Error(t, absl::StrCat("'", t.text, "' outside of a loop"));
      if (auto s = Expect(TK::kBlockEnd, "'%}'"); !s.ok()) return s;
      return node;
    }
    static const char* const kKnown[] = {"call",   "filter",     "raw",     "include",
                                         "import", "from",       "extends", "block",
                                         "with",   "autoescape", "do"};
    for (const char* k : kKnown) {
      if (t.text == k) return Error(t, absl::StrCat("unsupported statement '", t.text, "'"));
    }
    return Error(t, absl::StrCat("unknown statement '", t.text, "'"));
  }

  absl::StatusOr<std::unique_ptr<Node>> ParseIf(std::unique_ptr<Node> node) {
    node->kind = Node::Kind::kIf;
    while (true) {
      auto cond = ParseExpr();
      if (!cond.ok()) return cond.status();
      if (auto s = Expect(TK::kBlockEnd, "'%}'"); !s.ok()) return s;
      Body body;
      std::string end;
      if (auto s = ParseBody({"elif", "else", "endif"}, &body, &end); !s.ok()) return s;
      node->branches.emplace_back(std::move(*cond), std::move(body));
      if (end == "elif") continue;
      if (end == "else") {
        if (auto s = Expect(TK::kBlockEnd, "'%}'"); !s.ok()) return s;
        Body else_body;
        if (auto s = ParseBody({"endif"}, &else_body, &end); !s.ok()) return s;
        node->branches.emplace_back(nullptr, std::move(else_body));
      }
      if (auto s = Expect(TK::kBlockEnd, "'%}'"); !s.ok()) return s;
      return node;
    }
  }

  absl::StatusOr<std::unique_ptr<Node>> ParseFor(std::unique_ptr<Node> node) {
    node->kind = Node::Kind::kFor;
    do {
      auto name = ExpectName();
      if (!name.ok()) return name.status();
      node->targets.push_back(*name);
    } while (SkipOp(","));
    if (!SkipName("in")) return Error(Peek(), "expected 'in' in the for statement");
    // The iterable: no inline if/else here (jinja2 parses it with parse_tuple(no_condexpr)).
    auto iter = ParseOr();
    if (!iter.ok()) return iter.status();
    node->expr = std::move(*iter);
    if (SkipName("if")) {
      auto f = ParseExpr();
      if (!f.ok()) return f.status();
      node->filter = std::move(*f);
    }
    if (IsName("recursive")) return Error(Peek(), "unsupported: recursive for loops");
    if (auto s = Expect(TK::kBlockEnd, "'%}'"); !s.ok()) return s;
    std::string end;
    ++loop_depth_;
    auto s = ParseBody({"else", "endfor"}, &node->body, &end);
    --loop_depth_;
    if (!s.ok()) return s;
    if (end == "else") {
      if (auto s2 = Expect(TK::kBlockEnd, "'%}'"); !s2.ok()) return s2;
      if (auto s2 = ParseBody({"endfor"}, &node->else_body, &end); !s2.ok()) return s2;
    }
    if (auto s2 = Expect(TK::kBlockEnd, "'%}'"); !s2.ok()) return s2;
    return node;
  }

  // macro name(a, b=default, ...): body endmacro. No varargs/kwargs/caller.
  absl::StatusOr<std::unique_ptr<Node>> ParseMacro(std::unique_ptr<Node> node) {
    node->kind = Node::Kind::kMacro;
    auto name = ExpectName();
    if (!name.ok()) return name.status();
    node->targets.push_back(*name);
    if (auto s = ExpectOp("("); !s.ok()) return s;
    while (!SkipOp(")")) {
      if (node->targets.size() > 1) {
        if (auto s = ExpectOp(","); !s.ok()) return s;
        if (SkipOp(")")) break;
      }
      auto param = ExpectName();
      if (!param.ok()) return param.status();
      node->targets.push_back(*param);
      ExprPtr def;
      if (SkipOp("=")) {
        auto e = ParseExpr();
        if (!e.ok()) return e.status();
        def = std::move(*e);
      }
      node->defaults.push_back(std::move(def));
    }
    if (auto s = Expect(TK::kBlockEnd, "'%}'"); !s.ok()) return s;
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;  // break/continue do not reach through a macro
    std::string end;
    auto s = ParseBody({"endmacro"}, &node->body, &end);
    loop_depth_ = saved_loops;
    if (!s.ok()) return s;
    if (Peek().kind == TK::kName) Next();  // {% endmacro name %}
    if (auto s2 = Expect(TK::kBlockEnd, "'%}'"); !s2.ok()) return s2;
    return node;
  }

  absl::StatusOr<std::unique_ptr<Node>> ParseSet(std::unique_ptr<Node> node) {
    auto name = ExpectName();
    if (!name.ok()) return name.status();
    node->targets.push_back(*name);
    node->kind = Node::Kind::kSet;
    if (SkipOp(".")) {
      auto attr = ExpectName();
      if (!attr.ok()) return attr.status();
      node->attr = *attr;
      node->kind = Node::Kind::kSetAttr;
    } else {
      while (SkipOp(",")) {
        auto more = ExpectName();
        if (!more.ok()) return more.status();
        node->targets.push_back(*more);
      }
    }
    if (node->kind == Node::Kind::kSet && node->targets.size() == 1 &&
        Peek().kind == TK::kBlockEnd) {
      Next();
      node->kind = Node::Kind::kSetBlock;
      std::string end;
      if (auto s = ParseBody({"endset"}, &node->body, &end); !s.ok()) return s;
      if (auto s = Expect(TK::kBlockEnd, "'%}'"); !s.ok()) return s;
      return node;
    }
    if (auto s = ExpectOp("="); !s.ok()) return s;
    auto value = ParseTupleOrExpr();
    if (!value.ok()) return value.status();
    node->expr = std::move(*value);
    if (auto s = Expect(TK::kBlockEnd, "'%}'"); !s.ok()) return s;
    return node;
  }

  ExprPtr Make(Expr::Kind kind, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->column = at.column;
    return e;
  }

  // `a, b` (a tuple) or one expression.
  absl::StatusOr<ExprPtr> ParseTupleOrExpr() {
    const Token at = Peek();
    auto first = ParseExpr();
    if (!first.ok() || !IsOp(",")) return first;
    auto tuple = Make(Expr::Kind::kTuple, at);
    tuple->args.push_back(std::move(*first));
    while (SkipOp(",")) {
      if (Peek().kind == TK::kBlockEnd) break;
      auto e = ParseExpr();
      if (!e.ok()) return e.status();
      tuple->args.push_back(std::move(*e));
    }
    return tuple;
  }

  absl::StatusOr<ExprPtr> ParseExpr() {
    DepthGuard guard(&depth_);
    if (auto s = CheckDepth(); !s.ok()) return s;
    const Token at = Peek();
    auto expr = ParseOr();
    if (!expr.ok()) return expr;
    while (SkipName("if")) {
      auto cond = Make(Expr::Kind::kCondExpr, at);
      auto test = ParseOr();
      if (!test.ok()) return test.status();
      cond->args.push_back(std::move(*test));
      cond->args.push_back(std::move(*expr));
      if (SkipName("else")) {
        auto other = ParseExpr();
        if (!other.ok()) return other.status();
        cond->args.push_back(std::move(*other));
      } else {
        cond->args.push_back(nullptr);
      }
      *expr = std::move(cond);
    }
    return expr;
  }

  absl::StatusOr<ExprPtr> ParseBinaryChain(Expr::Kind kind, const char* word,
                                           absl::StatusOr<ExprPtr> (Parser::*next)()) {
    const Token at = Peek();
    auto left = (this->*next)();
    if (!left.ok()) return left;
    while (SkipName(word)) {
      auto right = (this->*next)();
      if (!right.ok()) return right;
      auto e = Make(kind, at);
      e->args.push_back(std::move(*left));
      e->args.push_back(std::move(*right));
      *left = std::move(e);
    }
    return left;
  }
  absl::StatusOr<ExprPtr> ParseOr() {
    return ParseBinaryChain(Expr::Kind::kOr, "or", &Parser::ParseAnd);
  }
  absl::StatusOr<ExprPtr> ParseAnd() {
    return ParseBinaryChain(Expr::Kind::kAnd, "and", &Parser::ParseNot);
  }
  absl::StatusOr<ExprPtr> ParseNot() {
    DepthGuard guard(&depth_);
    if (auto s = CheckDepth(); !s.ok()) return s;
    if (IsName("not")) {
      const Token at = Next();
      auto inner = ParseNot();
      if (!inner.ok()) return inner;
      auto e = Make(Expr::Kind::kNot, at);
      e->args.push_back(std::move(*inner));
      return e;
    }
    return ParseCompare();
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    const Token at = Peek();
    auto first = ParseMath1();
    if (!first.ok()) return first;
    ExprPtr cmp;
    while (true) {
      std::string op;
      const Token& t = Peek();
      if (t.kind == TK::kOp && (t.text == "==" || t.text == "!=" || t.text == "<" ||
                                t.text == "<=" || t.text == ">" || t.text == ">=")) {
        op = t.text;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && IsName("in", 1)) {
        op = "notin";
        Next();
        Next();
      } else {
        break;
      }
      auto right = ParseMath1();
      if (!right.ok()) return right;
      if (!cmp) {
        cmp = Make(Expr::Kind::kCompare, at);
        cmp->args.push_back(std::move(*first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(std::move(*right));
    }
    if (cmp) return cmp;
    return first;
  }

  absl::StatusOr<ExprPtr> ParseBinaryOps(std::initializer_list<const char*> ops,
                                         absl::StatusOr<ExprPtr> (Parser::*next)()) {
    const Token at = Peek();
    auto left = (this->*next)();
    if (!left.ok()) return left;
    while (true) {
      const char* found = nullptr;
      for (const char* op : ops) {
        if (IsOp(op)) found = op;
      }
      if (!found) return left;
      Next();
      auto right = (this->*next)();
      if (!right.ok()) return right;
      auto e = Make(Expr::Kind::kBinary, at);
      e->name = found;
      e->args.push_back(std::move(*left));
      e->args.push_back(std::move(*right));
      *left = std::move(e);
    }
  }
  absl::StatusOr<ExprPtr> ParseMath1() { return ParseBinaryOps({"+", "-"}, &Parser::ParseConcat); }
  absl::StatusOr<ExprPtr> ParseConcat() { return ParseBinaryOps({"~"}, &Parser::ParseMath2); }
  absl::StatusOr<ExprPtr> ParseMath2() {
    return ParseBinaryOps({"*", "/", "//", "%"}, &Parser::ParsePow);
  }
  absl::StatusOr<ExprPtr> ParsePow() { return ParseBinaryOps({"**"}, &Parser::ParseUnaryF); }
  absl::StatusOr<ExprPtr> ParseUnaryF() { return ParseUnary(true); }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    DepthGuard guard(&depth_);
    if (auto s = CheckDepth(); !s.ok()) return s;
    absl::StatusOr<ExprPtr> node;
    if (IsOp("-") || IsOp("+")) {
      const Token at = Next();
      auto inner = ParseUnary(false);
      if (!inner.ok()) return inner;
      auto e = Make(at.text == "-" ? Expr::Kind::kNeg : Expr::Kind::kPos, at);
      e->args.push_back(std::move(*inner));
      node = std::move(e);
    } else {
      node = ParsePrimary();
      if (!node.ok()) return node;
    }
    node = ParsePostfix(std::move(*node));
    if (!node.ok() || !with_filter) return node;
    return ParseFilterExpr(std::move(*node));
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token t = Peek();
    if (t.kind == TK::kLiteral) {
      Next();
      auto e = Make(Expr::Kind::kLiteral, t);
      e->literal = t.literal;
      // Adjacent string literals concatenate.
      while (e->literal.is_string() && Peek().kind == TK::kLiteral && Peek().literal.is_string()) {
        e->literal = Value::String(e->literal.str() + Next().literal.str());
      }
      return e;
    }
    if (t.kind == TK::kName) {
      Next();
      auto e = Make(Expr::Kind::kLiteral, t);
      if (t.text == "true" || t.text == "True") {
        e->literal = Value::Bool(true);
      } else if (t.text == "false" || t.text == "False") {
        e->literal = Value::Bool(false);
      } else if (t.text == "none" || t.text == "None") {
        e->literal = Value::None();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = t.text;
      }
      return e;
    }
    if (IsOp("(")) {
      Next();
      if (SkipOp(")")) return Make(Expr::Kind::kTuple, t);
      auto first = ParseExpr();
      if (!first.ok()) return first;
      if (SkipOp(")")) return first;
      auto tuple = Make(Expr::Kind::kTuple, t);
      tuple->args.push_back(std::move(*first));
      while (SkipOp(",")) {
        if (IsOp(")")) break;
        auto e = ParseExpr();
        if (!e.ok()) return e;
        tuple->args.push_back(std::move(*e));
      }
      if (auto s = ExpectOp(")"); !s.ok()) return s;
      return tuple;
    }
    if (IsOp("[")) {
      Next();
      auto list = Make(Expr::Kind::kList, t);
      while (!IsOp("]")) {
        if (!list->args.empty()) {
          if (auto s = ExpectOp(","); !s.ok()) return s;
          if (IsOp("]")) break;
        }
        auto e = ParseExpr();
        if (!e.ok()) return e;
        list->args.push_back(std::move(*e));
      }
      Next();
      return list;
    }
    if (IsOp("{")) {
      Next();
      auto dict = Make(Expr::Kind::kDict, t);
      while (!IsOp("}")) {
        if (!dict->args.empty()) {
          if (auto s = ExpectOp(","); !s.ok()) return s;
          if (IsOp("}")) break;
        }
        auto key = ParseExpr();
        if (!key.ok()) return key;
        if (auto s = ExpectOp(":"); !s.ok()) return s;
        auto value = ParseExpr();
        if (!value.ok()) return value;
        dict->args.push_back(std::move(*key));
        dict->args.push_back(std::move(*value));
      }
      Next();
      return dict;
    }
    return Error(t, absl::StrCat("unexpected ", Describe(t)));
  }

  // Call arguments after '(': positional, then name=value.
  absl::Status ParseArgs(Expr* e) {
    while (!IsOp(")")) {
      if (e->args.size() > 1 || !e->kwargs.empty()) {
        if (auto s = ExpectOp(","); !s.ok()) return s;
        if (IsOp(")")) break;
      }
      if (Peek().kind == TK::kName && IsOp("=", 1)) {
        std::string name = Next().text;
        Next();
        auto v = ParseExpr();
        if (!v.ok()) return v.status();
        e->kwargs.emplace_back(std::move(name), std::move(*v));
        continue;
      }
      if (!e->kwargs.empty()) return Error(Peek(), "positional argument after keyword argument");
      auto v = ParseExpr();
      if (!v.ok()) return v.status();
      e->args.push_back(std::move(*v));
    }
    Next();
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      const Token t = Peek();
      if (IsOp(".")) {
        Next();
        auto e = Make(Expr::Kind::kAttr, t);
        if (Peek().kind == TK::kName) {
          e->name = Next().text;
        } else if (Peek().kind == TK::kLiteral && Peek().literal.kind() == Value::Kind::kInt) {
          e->kind = Expr::Kind::kItem;
          auto idx = Make(Expr::Kind::kLiteral, Peek());
          idx->literal = Next().literal;
          e->args.push_back(std::move(node));
          e->args.push_back(std::move(idx));
          node = std::move(e);
          continue;
        } else {
          return Error(Peek(), "expected an attribute name after '.'");
        }
        e->args.push_back(std::move(node));
        node = std::move(e);
      } else if (IsOp("[")) {
        Next();
        auto e = Make(Expr::Kind::kItem, t);
        e->args.push_back(std::move(node));
        ExprPtr parts[3];
        int n = 0;
        bool slice = false;
        while (true) {
          if (IsOp(":")) {
            Next();
            slice = true;
            if (++n > 2) return Error(t, "too many ':' in a slice");
            continue;
          }
          if (IsOp("]")) break;
          if (parts[n]) return Error(Peek(), "expected ':' or ']'");
          auto v = ParseExpr();
          if (!v.ok()) return v;
          parts[n] = std::move(*v);
        }
        Next();
        if (slice) {
          e->kind = Expr::Kind::kSlice;
          for (auto& p : parts) e->args.push_back(std::move(p));
        } else {
          if (!parts[0]) return Error(t, "expected a subscript");
          e->args.push_back(std::move(parts[0]));
        }
        node = std::move(e);
      } else if (IsOp("(")) {
        Next();
        auto e = Make(Expr::Kind::kCall, t);
        e->args.push_back(std::move(node));
        if (auto s = ParseArgs(e.get()); !s.ok()) return s;
        node = std::move(e);
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node) {
    while (true) {
      const Token t = Peek();
      if (SkipOp("|")) {
        auto name = ExpectName();
        if (!name.ok()) return name.status();
        auto e = Make(Expr::Kind::kFilter, t);
        e->name = *name;
        e->args.push_back(std::move(node));
        if (SkipOp("(")) {
          if (auto s = ParseArgs(e.get()); !s.ok()) return s;
        }
        node = std::move(e);
      } else if (SkipName("is")) {
        auto e = Make(Expr::Kind::kTest, t);
        e->negated = SkipName("not");
        auto name = ExpectName();
        if (!name.ok()) return name.status();
        e->name = *name;
        e->args.push_back(std::move(node));
        if (SkipOp("(")) {
          if (auto s = ParseArgs(e.get()); !s.ok()) return s;
        } else if (Peek().kind == TK::kLiteral || IsOp("[") || IsOp("{") ||
                   (Peek().kind == TK::kName && !IsName("else") && !IsName("or") &&
                    !IsName("and"))) {
          if (IsName("is")) return Error(Peek(), "you cannot chain multiple tests with is");
          // `is sameas false`, `is equalto 'x'`: one argument without parentheses.
          auto arg = ParsePrimary();
          if (!arg.ok()) return arg;
          auto post = ParsePostfix(std::move(*arg));
          if (!post.ok()) return post;
          e->args.push_back(std::move(*post));
        }
        node = std::move(e);
      } else {
        return node;
      }
    }
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int max_depth_;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

absl::StatusOr<Body> ParseTemplate(std::string_view source, int max_depth) {
  auto tokens = LexTemplate(source);
  if (!tokens.ok()) return tokens.status();
  return Parser(std::move(*tokens), max_depth).Run();
}

}  // namespace heavykv::jinja
