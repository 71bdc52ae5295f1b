// The chat-template interpreter (engine/chat/chat_template.h): walks the tree ParseTemplate built,
// with jinja2's scoping (a for loop's body is its own scope; if bodies are not) and Python's
// operator semantics, charging every evaluation to the render's Budget.
#include "engine/chat/chat_template.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/chat/chat_template_ast.h"
#include "engine/chat/chat_template_builtins.h"
#include "engine/chat/chat_template_json.h"
#include "engine/chat/chat_template_ops.h"

namespace heavykv {

struct ChatTemplate::Program {
  std::string source;
  jinja::Body body;
};

namespace jinja {
namespace {

enum class Flow { kNormal, kBreak, kContinue };

// Macro values are functions named kMacroPrefix + their index in Renderer::macros_.
constexpr char kMacroPrefix[] = "\x01macro";

// A loop iteration costs more than an expression: it builds the `loop` object and a scope.
constexpr int64_t kStepsPerIteration = 8;

class Renderer {
 public:
  Renderer(const ChatRenderLimits& limits, absl::Time now)
      : budget_(limits.max_steps, limits.max_output_bytes),
        ctx_{&budget_, now, {}},
        max_depth_(limits.max_depth) {
    scopes_.emplace_back();
  }
  ~Renderer() {
    for (const Value& ns : ctx_.namespaces) ns.mutable_namespace().clear();
  }
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  void Set(const std::string& name, Value v) { scopes_.back()[name] = std::move(v); }

  absl::Status Exec(const Body& body, std::string* out, Flow* flow) {
    for (const auto& node : body) {
      if (auto s = ExecNode(*node, out, flow); !s.ok()) return s;
      if (*flow != Flow::kNormal) return absl::OkStatus();
    }
    return absl::OkStatus();
  }

 private:
  struct DepthGuard {
    explicit DepthGuard(int* d) : depth(d) { ++*depth; }
    ~DepthGuard() { --*depth; }
    int* depth;
  };

  // A runtime error with the node's place, unless it already has one (or is raise_exception's
  // or a budget's).
  static absl::Status At(int line, int column, absl::Status s) {
    if (s.ok() || s.code() != absl::StatusCode::kInvalidArgument ||
        absl::StartsWith(s.message(), "chat template line")) {
      return s;
    }
    return absl::InvalidArgumentError(
        absl::StrCat("chat template line ", line, ", column ", column, ": ", s.message()));
  }

  // Checks the whole output's size but charges only the new bytes.
  absl::Status Append(std::string* out, const std::string& text) {
    if (auto s = budget_.Size(static_cast<int64_t>(text.size())); !s.ok()) return s;
    if (static_cast<int64_t>(out->size() + text.size()) > budget_.max_bytes()) {
      return budget_.Size(budget_.max_bytes() + 1);
    }
    *out += text;
    return absl::OkStatus();
  }

  // Operations on a value take time in its size (decoding a string, copying or comparing a
  // list): charge that before doing them.
  absl::Status ChargeFor(const Value& v) {
    if (v.is_string()) return budget_.Charge(static_cast<int64_t>(v.str().size()) / 64);
    if (v.is_list()) return budget_.Charge(static_cast<int64_t>(v.list().size()) / 8);
    if (v.is_dict()) return budget_.Charge(static_cast<int64_t>(v.dict().size()) / 8);
    return absl::OkStatus();
  }

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = it->find(name);
      if (found != it->end()) return found->second;
    }
    if (IsGlobal(name)) return Value::Function(name);
    return Value::Undefined(name);
  }

  absl::Status ExecNode(const Node& node, std::string* out, Flow* flow) {
    DepthGuard guard(&depth_);
    if (depth_ > max_depth_) {
      return absl::ResourceExhaustedError("chat template: nesting too deep while rendering");
    }
    if (auto s = budget_.Charge(1); !s.ok()) return s;
    switch (node.kind) {
      case Node::Kind::kText:
        return Append(out, node.text);
      case Node::Kind::kOutput: {
        auto v = Eval(*node.expr);
        if (!v.ok()) return v.status();
        return Append(out, v->Str(static_cast<size_t>(budget_.max_bytes())));
      }
      case Node::Kind::kIf:
        for (const auto& [cond, body] : node.branches) {
          bool take = true;
          if (cond) {
            auto v = Eval(*cond);
            if (!v.ok()) return v.status();
            take = v->Truthy();
          }
          if (take) return Exec(body, out, flow);
        }
        return absl::OkStatus();
      case Node::Kind::kFor:
        return ExecFor(node, out);
      case Node::Kind::kSet: {
        auto v = Eval(*node.expr);
        if (!v.ok()) return v.status();
        return Assign(node, *v);
      }
      case Node::Kind::kSetAttr: {
        Value ns = Lookup(node.targets[0]);
        if (ns.kind() != Value::Kind::kNamespace) {
          return At(
              node.line, node.column,
              absl::InvalidArgumentError("can't assign an attribute of a non-namespace object"));
        }
        auto v = Eval(*node.expr);
        if (!v.ok()) return v.status();
        ValueDict& d = ns.mutable_namespace();
        for (auto& [k, val] : d) {
          if (k.is_string() && k.str() == node.attr) {
            val = *v;
            return absl::OkStatus();
          }
        }
        d.emplace_back(Value::String(node.attr), *v);
        return absl::OkStatus();
      }
      case Node::Kind::kSetBlock: {
        std::string captured;
        Flow inner = Flow::kNormal;
        if (auto s = Exec(node.body, &captured, &inner); !s.ok()) return s;
        Set(node.targets[0], Value::String(std::move(captured)));
        return absl::OkStatus();
      }
      case Node::Kind::kMacro:
        // A callable named by its node; the template outlives the render.
        macros_.push_back(&node);
        Set(node.targets[0], Value::Function(absl::StrCat(kMacroPrefix, macros_.size() - 1)));
        return absl::OkStatus();
      case Node::Kind::kBreak:
        *flow = Flow::kBreak;
        return absl::OkStatus();
      case Node::Kind::kContinue:
        *flow = Flow::kContinue;
        return absl::OkStatus();
    }
    return absl::OkStatus();
  }

  absl::Status Assign(const Node& node, const Value& v) {
    if (node.targets.size() == 1) {
      Set(node.targets[0], v);
      return absl::OkStatus();
    }
    return Unpack(node, node.targets, v);
  }

  absl::Status Unpack(const Node& node, const std::vector<std::string>& targets, const Value& v) {
    auto items = Iterate(v);
    if (!items.ok()) return At(node.line, node.column, items.status());
    if (items->size() != targets.size()) {
      return At(node.line, node.column,
                absl::InvalidArgumentError(absl::StrCat("cannot unpack ", items->size(),
                                                        " values into ", targets.size())));
    }
    for (size_t k = 0; k < targets.size(); ++k) Set(targets[k], (*items)[k]);
    return absl::OkStatus();
  }

  absl::Status ExecFor(const Node& node, std::string* out) {
    auto seq = Eval(*node.expr);
    if (!seq.ok()) return seq.status();
    auto all = Iterate(*seq);
    if (!all.ok()) return At(node.line, node.column, all.status());
    std::vector<Value> items;
    if (node.filter) {
      for (const Value& item : *all) {
        if (auto s = budget_.Charge(1); !s.ok()) return s;
        scopes_.emplace_back();
        absl::Status s = BindTargets(node, item);
        absl::StatusOr<Value> keep = s.ok() ? Eval(*node.filter) : absl::StatusOr<Value>(s);
        scopes_.pop_back();
        if (!keep.ok()) return keep.status();
        if (keep->Truthy()) items.push_back(item);
      }
    } else {
      items = std::move(*all);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      if (auto s = budget_.Charge(kStepsPerIteration); !s.ok()) return s;
      scopes_.emplace_back();
      ValueDict loop = {
          {Value::String("index"), Value::Int(k + 1)},
          {Value::String("index0"), Value::Int(k)},
          {Value::String("revindex"), Value::Int(n - k)},
          {Value::String("revindex0"), Value::Int(n - k - 1)},
          {Value::String("first"), Value::Bool(k == 0)},
          {Value::String("last"), Value::Bool(k == n - 1)},
          {Value::String("length"), Value::Int(n)},
          {Value::String("depth"), Value::Int(1)},
          {Value::String("depth0"), Value::Int(0)},
      };
      if (k > 0) loop.emplace_back(Value::String("previtem"), items[static_cast<size_t>(k - 1)]);
      if (k + 1 < n)
        loop.emplace_back(Value::String("nextitem"), items[static_cast<size_t>(k + 1)]);
      Set("loop", Value::Dict(std::move(loop)));
      absl::Status s = BindTargets(node, items[static_cast<size_t>(k)]);
      Flow flow = Flow::kNormal;
      if (s.ok()) s = Exec(node.body, out, &flow);
      scopes_.pop_back();
      if (!s.ok()) return s;
      if (flow == Flow::kBreak) break;
    }
    if (n == 0 && !node.else_body.empty()) {
      Flow flow = Flow::kNormal;
      return Exec(node.else_body, out, &flow);
    }
    return absl::OkStatus();
  }

  absl::Status BindTargets(const Node& node, const Value& item) {
    if (node.targets.size() == 1) {
      Set(node.targets[0], item);
      return absl::OkStatus();
    }
    return Unpack(node, node.targets, item);
  }

  absl::StatusOr<Args> EvalArgs(const Expr& e, size_t first) {
    Args args;
    for (size_t k = first; k < e.args.size(); ++k) {
      auto v = Eval(*e.args[k]);
      if (!v.ok()) return v.status();
      if (auto s = ChargeFor(*v); !s.ok()) return s;
      args.pos.push_back(std::move(*v));
    }
    for (const auto& [name, expr] : e.kwargs) {
      auto v = Eval(*expr);
      if (!v.ok()) return v.status();
      args.kw.emplace_back(name, std::move(*v));
    }
    return args;
  }

  absl::StatusOr<Value> Eval(const Expr& e) {
    DepthGuard guard(&depth_);
    if (depth_ > max_depth_) {
      return absl::ResourceExhaustedError("chat template: nesting too deep while rendering");
    }
    if (auto s = budget_.Charge(1); !s.ok()) return s;
    auto v = EvalInner(e);
    if (!v.ok()) return At(e.line, e.column, v.status());
    return v;
  }

  absl::StatusOr<Value> EvalInner(const Expr& e) {
    using K = Expr::Kind;
    switch (e.kind) {
      case K::kLiteral:
        return e.literal;
      case K::kName:
        return Lookup(e.name);
      case K::kList:
      case K::kTuple: {
        ValueList items;
        for (const auto& a : e.args) {
          auto v = Eval(*a);
          if (!v.ok()) return v;
          items.push_back(std::move(*v));
        }
        return Value::List(std::move(items), e.kind == K::kTuple);
      }
      case K::kDict: {
        ValueDict items;
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          auto key = Eval(*e.args[k]);
          if (!key.ok()) return key;
          auto v = Eval(*e.args[k + 1]);
          if (!v.ok()) return v;
          bool replaced = false;
          for (auto& [ek, ev] : items) {
            if (Equal(ek, *key)) {
              ev = *v;
              replaced = true;
            }
          }
          if (!replaced) items.emplace_back(std::move(*key), std::move(*v));
        }
        return Value::Dict(std::move(items));
      }
      case K::kAttr: {
        auto obj = Eval(*e.args[0]);
        if (!obj.ok()) return obj;
        return GetAttr(*obj, e.name);
      }
      case K::kItem: {
        auto obj = Eval(*e.args[0]);
        if (!obj.ok()) return obj;
        if (obj->is_string()) {
          if (auto s = ChargeFor(*obj); !s.ok()) return s;
        }
        auto key = Eval(*e.args[1]);
        if (!key.ok()) return key;
        return GetItem(*obj, *key);
      }
      case K::kSlice:
        return EvalSlice(e);
      case K::kCall:
        return EvalCall(e);
      case K::kFilter: {
        auto subject = Eval(*e.args[0]);
        if (!subject.ok()) return subject;
        if (auto s = ChargeFor(*subject); !s.ok()) return s;
        auto args = EvalArgs(e, 1);
        if (!args.ok()) return args.status();
        return ApplyFilter(e.name, *subject, *args, ctx_);
      }
      case K::kTest: {
        auto subject = Eval(*e.args[0]);
        if (!subject.ok()) return subject;
        if (auto s = ChargeFor(*subject); !s.ok()) return s;
        auto args = EvalArgs(e, 1);
        if (!args.ok()) return args.status();
        auto r = ApplyTest(e.name, *subject, *args);
        if (!r.ok()) return r.status();
        return Value::Bool(*r != e.negated);
      }
      case K::kNot: {
        auto v = Eval(*e.args[0]);
        if (!v.ok()) return v;
        return Value::Bool(!v->Truthy());
      }
      case K::kNeg:
      case K::kPos: {
        auto v = Eval(*e.args[0]);
        if (!v.ok()) return v;
        if (v->is_undefined()) return UndefinedError(*v);
        if (!v->is_number()) {
          return absl::InvalidArgumentError(absl::StrCat("bad operand type for unary ",
                                                         e.kind == K::kNeg ? "-" : "+", ": '",
                                                         v->TypeName(), "'"));
        }
        if (e.kind == K::kPos) return v->kind() == Value::Kind::kBool ? Value::Int(v->i()) : *v;
        if (v->kind() == Value::Kind::kFloat) return Value::Float(-v->f());
        if (v->i() == std::numeric_limits<int64_t>::min()) {
          return absl::InvalidArgumentError("integer overflow");
        }
        return Value::Int(-v->i());
      }
      case K::kAnd:
      case K::kOr: {
        auto left = Eval(*e.args[0]);
        if (!left.ok()) return left;
        if (left->Truthy() == (e.kind == K::kOr)) return left;
        return Eval(*e.args[1]);
      }
      case K::kCondExpr: {
        auto test = Eval(*e.args[0]);
        if (!test.ok()) return test;
        if (test->Truthy()) return Eval(*e.args[1]);
        if (!e.args[2]) return Value::Undefined("the inline if's missing else");
        return Eval(*e.args[2]);
      }
      case K::kCompare:
        return EvalCompare(e);
      case K::kBinary: {
        auto left = Eval(*e.args[0]);
        if (!left.ok()) return left;
        auto right = Eval(*e.args[1]);
        if (!right.ok()) return right;
        return BinaryOp(e.name, *left, *right, &budget_);
      }
    }
    return absl::InternalError("unknown expression");
  }

  absl::StatusOr<Value> EvalCall(const Expr& e) {
    const Expr& callee = *e.args[0];
    if (callee.kind == Expr::Kind::kAttr) {
      auto obj = Eval(*callee.args[0]);
      if (!obj.ok()) return obj;
      if (auto s = ChargeFor(*obj); !s.ok()) return s;
      auto args = EvalArgs(e, 1);
      if (!args.ok()) return args.status();
      if (obj->is_string() || obj->is_list() || obj->kind() == Value::Kind::kDict ||
          obj->is_undefined()) {
        Value attr = obj->kind() == Value::Kind::kDict ? obj->Get(callee.name) : Value();
        if (attr.kind() != Value::Kind::kFunction)
          return CallMethod(*obj, callee.name, *args, ctx_);
        return CallGlobal(attr.str(), *args, ctx_);
      }
      auto attr = GetAttr(*obj, callee.name);
      if (!attr.ok()) return attr;
      return CallValue(*attr, *args);
    }
    auto fn = Eval(callee);
    if (!fn.ok()) return fn;
    auto args = EvalArgs(e, 1);
    if (!args.ok()) return args.status();
    return CallValue(*fn, *args);
  }

  absl::StatusOr<Value> CallValue(const Value& fn, const Args& args) {
    if (fn.is_undefined()) return UndefinedError(fn);
    if (fn.kind() != Value::Kind::kFunction) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", fn.TypeName(), "' object is not callable"));
    }
    if (absl::StartsWith(fn.str(), kMacroPrefix)) return CallMacro(fn.str(), args);
    return CallGlobal(fn.str(), args, ctx_);
  }

  // A macro's body rendered with its parameters bound, seeing the template's top-level
  // variables (jinja2 macros close over the module, not over the caller's loop).
  absl::StatusOr<Value> CallMacro(const std::string& id, const Args& args) {
    size_t index = 0;
    for (size_t k = std::strlen(kMacroPrefix); k < id.size(); ++k) {
      index = index * 10 + static_cast<size_t>(id[k] - '0');
    }
    const Node& macro = *macros_.at(index);
    const size_t num_params = macro.targets.size() - 1;
    if (args.pos.size() > num_params) {
      return absl::InvalidArgumentError(absl::StrCat(
          "macro '", macro.targets[0], "' takes not more than ", num_params, " argument(s)"));
    }
    absl::flat_hash_map<std::string, Value> frame;
    for (size_t k = 0; k < num_params; ++k) {
      const std::string& param = macro.targets[k + 1];
      if (k < args.pos.size()) {
        frame[param] = args.pos[k];
        continue;
      }
      const Value* kw = nullptr;
      for (const auto& [name, v] : args.kw) {
        if (name == param) kw = &v;
      }
      if (kw) {
        frame[param] = *kw;
      } else if (macro.defaults[k]) {
        auto v = Eval(*macro.defaults[k]);
        if (!v.ok()) return v;
        frame[param] = *v;
      } else {
        frame[param] = Value::Undefined(param);
      }
    }
    for (const auto& [name, v] : args.kw) {
      if (!frame.contains(name)) {
        return absl::InvalidArgumentError(
            absl::StrCat("macro '", macro.targets[0], "' has no parameter '", name, "'"));
      }
    }
    std::vector<absl::flat_hash_map<std::string, Value>> saved;
    saved.swap(scopes_);
    scopes_.push_back(saved.front());
    scopes_.push_back(std::move(frame));
    std::string out;
    Flow flow = Flow::kNormal;
    absl::Status s = Exec(macro.body, &out, &flow);
    scopes_.swap(saved);
    if (!s.ok()) return s;
    return Value::String(std::move(out));
  }

  absl::StatusOr<Value> EvalSlice(const Expr& e) {
    auto obj = Eval(*e.args[0]);
    if (!obj.ok()) return obj;
    if (auto s = ChargeFor(*obj); !s.ok()) return s;
    int64_t bounds[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    for (int k = 0; k < 3; ++k) {
      if (!e.args[static_cast<size_t>(k) + 1]) continue;
      auto v = Eval(*e.args[static_cast<size_t>(k) + 1]);
      if (!v.ok()) return v;
      if (v->is_none()) continue;
      if (v->kind() != Value::Kind::kInt && v->kind() != Value::Kind::kBool) {
        return absl::InvalidArgumentError("slice indices must be integers or None");
      }
      bounds[k] = v->i();
      given[k] = true;
    }
    return SliceOf(*obj, bounds, given, &budget_);
  }

  absl::StatusOr<Value> EvalCompare(const Expr& e) {
    auto left = Eval(*e.args[0]);
    if (!left.ok()) return left;
    for (size_t k = 0; k < e.ops.size(); ++k) {
      auto right = Eval(*e.args[k + 1]);
      if (!right.ok()) return right;
      if (auto s = ChargeFor(*right); !s.ok()) return s;
      if (auto s = ChargeFor(*left); !s.ok()) return s;
      const std::string& op = e.ops[k];
      bool r;
      if (op == "==" || op == "!=") {
        r = Equal(*left, *right) == (op == "==");
      } else if (op == "in" || op == "notin") {
        if (right->is_none() || right->is_number()) {
          return absl::InvalidArgumentError(
              absl::StrCat("argument of type '", right->TypeName(), "' is not iterable"));
        }
        auto in = ApplyTest("in", *left, Args{{*right}, {}});
        if (!in.ok()) return in.status();
        r = *in == (op == "in");
      } else {
        if (left->is_undefined()) return UndefinedError(*left);
        if (right->is_undefined()) return UndefinedError(*right);
        const bool swap = op == ">" || op == "<=";
        auto less = swap ? Less(*right, *left) : Less(*left, *right);
        if (!less.ok()) return less.status();
        r = (op == "<" || op == ">") ? *less : !*less;
      }
      if (!r) return Value::Bool(false);
      left = std::move(right);
    }
    return Value::Bool(true);
  }

  Budget budget_;
  BuiltinContext ctx_;
  int max_depth_;
  int depth_ = 0;
  std::vector<absl::flat_hash_map<std::string, Value>> scopes_;
  std::vector<const Node*> macros_;  // defined so far in this render
};

}  // namespace
}  // namespace jinja

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source,
                                                 const ChatRenderLimits& limits) {
  auto body = jinja::ParseTemplate(source, limits.max_depth);
  if (!body.ok()) return body.status();
  auto program = std::make_shared<Program>();
  program->source = std::string(source);
  program->body = std::move(*body);
  return ChatTemplate(std::move(program));
}

const std::string& ChatTemplate::source() const { return program_->source; }

absl::StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                 const ChatRenderOptions& opts) const {
  using jinja::Value;
  jinja::Renderer r(opts.limits, opts.now.value_or(absl::Now()));
  absl::StatusOr<Value> messages_value = jinja::MessagesValue(messages);
  if (!messages_value.ok()) return messages_value.status();
  r.Set("messages", *std::move(messages_value));
  r.Set("bos_token", Value::String(opts.bos_token));
  r.Set("eos_token", Value::String(opts.eos_token));
  r.Set("add_generation_prompt", Value::Bool(opts.add_generation_prompt));
  Value tools = Value::None();
  if (!opts.tools_json.empty()) {
    absl::StatusOr<Value> v = jinja::ValueFromJson(opts.tools_json, "tools");
    if (!v.ok()) return v.status();
    if (!v->is_list()) return absl::InvalidArgumentError("tools is not a JSON list");
    tools = *std::move(v);
  }
  r.Set("tools", tools);
  r.Set("documents", Value::None());
  for (const auto& [k, v] : opts.extra_strings) r.Set(k, Value::String(v));
  for (const auto& [k, v] : opts.extra_bools) r.Set(k, Value::Bool(v));
  if (!opts.extra_json.empty()) {
    absl::StatusOr<Value> extra = jinja::ValueFromJson(opts.extra_json, "chat_template_kwargs");
    if (!extra.ok()) return extra.status();
    if (extra->kind() != Value::Kind::kDict) {
      return absl::InvalidArgumentError("chat_template_kwargs is not a JSON object");
    }
    for (const auto& [k, v] : extra->dict()) {
      if (k.str() != "messages" && k.str() != "tools") r.Set(k.str(), v);
    }
  }
  std::string out;
  jinja::Flow flow = jinja::Flow::kNormal;
  absl::Status s = r.Exec(program_->body, &out, &flow);
  if (s.code() == jinja::kRaisedCode) return absl::InvalidArgumentError(s.message());
  if (!s.ok()) return s;
  return out;
}

}  // namespace heavykv
