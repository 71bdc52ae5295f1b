#include "engine/grammar/constraint.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/grammar/gbnf.h"
#include "engine/grammar/json_schema.h"
#include "engine/grammar/regex.h"
#include "engine/grammar/tool_grammar.h"

namespace heavykv::grammar {

std::string ConstraintSpec::CacheKey() const {
  std::string key = absl::StrCat(int(kind), strict ? "s" : "-", trigger_in_grammar ? "t" : "-",
                                 optional_reasoning ? "r" : "-",
                                 ":", text.size(), ":", text);
  for (const std::string& c : choices) absl::StrAppend(&key, "|", c.size(), ":", c);
  for (const std::string& t : triggers) absl::StrAppend(&key, "#", t.size(), ":", t);
  return key;
}

const char* ConstraintSpec::KindName() const {
  switch (kind) {
    case Kind::kNone:
      return "none";
    case Kind::kJsonObject:
      return "json_object";
    case Kind::kJsonSchema:
      return "json_schema";
    case Kind::kRegex:
      return "regex";
    case Kind::kChoice:
      return "choice";
    case Kind::kGbnf:
      return "grammar";
    case Kind::kToolCalls:
      return "tool_calls";
  }
  return "none";
}

namespace {

constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";

// Any bytes that do not contain `p` (non-empty): the states of p's prefix automaton (the
// longest prefix of p that the text ends with), each a rule that loops in tail position.
GrammarBuilder::Expr TextWithout(GrammarBuilder& b, std::string_view p) {
  const size_t m = p.size();
  // next[i][c]: the longest prefix of p that (p[0, i) + c) ends with.
  std::vector<std::array<int32_t, 256>> next(m);
  for (size_t i = 0; i < m; ++i) {
    for (int c = 0; c < 256; ++c) {
      std::string s = std::string(p.substr(0, i)) + char(c);
      size_t k = std::min(s.size(), m);
      while (k > 0 && s.compare(s.size() - k, k, p, 0, k) != 0) --k;
      next[i][size_t(c)] = int32_t(k);
    }
  }
  std::vector<RuleId> rules;
  for (size_t i = 0; i < m; ++i) rules.push_back(b.DeclareRule(absl::StrCat("_without", i)));
  for (size_t i = 0; i < m; ++i) {
    std::vector<GrammarBuilder::Expr> alts = {b.Empty()};
    for (size_t j = 0; j < m; ++j) {  // one alternative per next state (m itself: p, refused)
      ByteSet to;
      for (int c = 0; c < 256; ++c) {
        if (next[i][size_t(c)] == int32_t(j)) to.Add(uint8_t(c));
      }
      if (!to.Empty()) alts.push_back(b.Seq({b.Bytes(to), b.Ref(rules[j])}));
    }
    b.DefineRule(rules[i], b.Alt(std::move(alts)));
  }
  return b.Ref(rules[0]);
}

}  // namespace

absl::StatusOr<Grammar> CompileGrammar(const ConstraintSpec& spec, const GrammarLimits& limits) {
  if (spec.kind == ConstraintSpec::Kind::kGbnf) return CompileGbnf(spec.text, "root", limits);
  GrammarBuilder b(limits);
  JsonSchemaOptions json;
  json.strict = spec.strict;
  absl::StatusOr<GrammarBuilder::Expr> body;
  switch (spec.kind) {
    case ConstraintSpec::Kind::kNone:
      return absl::InvalidArgumentError("no constraint to compile");
    case ConstraintSpec::Kind::kJsonObject:
      body = AnyJsonObject(b, json);
      break;
    case ConstraintSpec::Kind::kJsonSchema:
      body = CompileJsonSchema(b, spec.text, json);
      break;
    case ConstraintSpec::Kind::kRegex:
      body = CompileRegex(b, spec.text, RegexOptions{.search = false});
      break;
    case ConstraintSpec::Kind::kChoice: {
      if (spec.choices.empty()) return absl::InvalidArgumentError("the choice list is empty");
      body = CompileChoice(b, spec.choices);  // a prefix tree: one stack however many choices
      break;
    }
    case ConstraintSpec::Kind::kToolCalls:
      body = CompileToolCalls(b, spec.text, json);
      break;
    case ConstraintSpec::Kind::kGbnf:
      break;
  }
  if (!body.ok()) return body.status();
  // A constraint that starts after a trigger it does not include (reasoning's "</think>") lets
  // the model keep the line breaks it writes after the trigger.
  if (!spec.triggers.empty() && !spec.trigger_in_grammar) {
    const GrammarBuilder::Expr ws = b.Repeat(b.Bytes(ByteSet::Of(' ') | ByteSet::Of('\n')), 0, 4);
    body = b.Seq({ws, *body});
  }
  if (spec.optional_reasoning && spec.triggers.empty()) {
    const GrammarBuilder::Expr ws = b.Repeat(b.Bytes(ByteSet::Of(' ') | ByteSet::Of('\n')), 0, 4);
    body = b.Seq({b.Optional(b.Seq({b.Literal(kThinkOpen), TextWithout(b, kThinkClose),
                                    b.Literal(kThinkClose), ws})),
                  *body});
  }
  const RuleId root = b.DeclareRule("root");
  b.DefineRule(root, *body);
  return std::move(b).Build(root);
}

ConstraintCompiler::ConstraintCompiler(std::shared_ptr<const TokenVocabulary> vocab,
                                       size_t max_entries, GrammarLimits limits)
    : vocab_(std::move(vocab)), max_entries_(std::max<size_t>(1, max_entries)), limits_(limits) {}

absl::StatusOr<std::shared_ptr<const CompiledConstraint>> ConstraintCompiler::Compile(
    const ConstraintSpec& spec) {
  const std::string key = spec.CacheKey();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      if (it->second->second->automaton->status().ok()) {
        lru_.splice(lru_.begin(), lru_, it->second);
        return it->second->second;
      }
      // Past a limit (a request walked it somewhere huge): its users keep it, new ones get a
      // fresh one.
      lru_.erase(it->second);
      index_.erase(it);
    }
  }
  // Compiled outside the lock: a slow schema does not hold up requests whose grammar is cached.
  const absl::Time start = absl::Now();
  absl::StatusOr<Grammar> g = CompileGrammar(spec, limits_);
  if (!g.ok()) return g.status();
  auto c = std::make_shared<CompiledConstraint>();
  c->spec = spec;
  c->automaton =
      std::make_shared<Automaton>(std::make_shared<const Grammar>(*std::move(g)), vocab_);
  if (c->automaton->Start() == Automaton::kDead) {
    absl::Status s = c->automaton->status();
    return s.ok() ? absl::InvalidArgumentError(absl::StrCat(
                        "the ", spec.KindName(), " constraint matches no text at all"))
                  : s;
  }
  c->compile_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = index_.find(key); it != index_.end()) return it->second->second;
  lru_.emplace_front(key, c);
  index_[key] = lru_.begin();
  while (lru_.size() > max_entries_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return std::shared_ptr<const CompiledConstraint>(c);
}

ConstraintMatcher::ConstraintMatcher(std::shared_ptr<const CompiledConstraint> constraint)
    : c_(std::move(constraint)), a_(c_->automaton.get()) {
  in_reasoning_ = c_->spec.optional_reasoning && !c_->spec.triggers.empty();
  for (const std::string& t : c_->spec.triggers) max_trigger_ = std::max(max_trigger_, t.size());
  if (c_->spec.triggers.empty()) {
    active_ = true;
    state_ = a_->Start();
  }
}

void ConstraintMatcher::Activate(std::string_view tail) {
  active_ = true;
  state_ = a_->StepBytes(a_->Start(), tail);
  pending_.clear();
}

void ConstraintMatcher::FillMask(std::span<uint64_t> words) {
  if (!active_) {
    std::fill(words.begin(), words.end(), ~uint64_t{0});
    return;
  }
  a_->FillMask(state_, words);
}

absl::Status ConstraintMatcher::Accept(int32_t token) {
  const TokenVocabulary& v = *a_->vocab();
  if (token < 0 || token >= v.size()) {
    return absl::InvalidArgumentError(absl::StrCat("token ", token, " is outside the vocabulary"));
  }
  if (!active_) {
    if (!v.IsText(token)) return absl::OkStatus();
    if (in_reasoning_) {  // a reasoning block first: triggers count only after it
      head_ += v.bytes(token);
      const std::string_view open = kThinkOpen;
      if (head_.size() < open.size() && open.substr(0, head_.size()) == head_) {
        return absl::OkStatus();  // may still open one
      }
      if (head_.compare(0, open.size(), open) != 0) {  // no reasoning: all of it is output
        in_reasoning_ = false;
        pending_ = std::move(head_);
      } else if (const size_t end = head_.find(kThinkClose); end != std::string::npos) {
        in_reasoning_ = false;
        pending_ = head_.substr(end + kThinkClose.size());
      } else {
        if (head_.size() > 64) head_.erase(open.size(), head_.size() - 64);  // keep the tail
        return absl::OkStatus();
      }
      head_.clear();
    } else {
      pending_ += v.bytes(token);
    }
    for (const std::string& t : c_->spec.triggers) {
      const size_t at = pending_.find(t);
      if (at == std::string::npos) continue;
      const std::string tail =
          pending_.substr(c_->spec.trigger_in_grammar ? at : at + t.size());
      Activate(tail);
      if (state_ == Automaton::kDead) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the output after `", t, "` does not match the ", c_->spec.KindName(), " constraint"));
      }
      complete_ = a_->Accepting(state_) && !a_->CanContinue(state_);
      return absl::OkStatus();
    }
    // Keep only what a trigger could still start in.
    if (max_trigger_ > 0 && pending_.size() > max_trigger_) {
      pending_.erase(0, pending_.size() - (max_trigger_ - 1));
    }
    return absl::OkStatus();
  }
  if (v.IsEog(token)) {
    if (!a_->Accepting(state_)) {
      return absl::FailedPreconditionError("the output ended before the constraint was matched");
    }
    complete_ = true;
    return absl::OkStatus();
  }
  const int32_t next = a_->StepToken(state_, token);
  if (next == Automaton::kDead) {
    absl::Status s = a_->status();
    return s.ok() ? absl::FailedPreconditionError(absl::StrCat(
                        "token ", token, " does not fit the ", c_->spec.KindName(), " constraint"))
                  : s;
  }
  state_ = next;
  complete_ = a_->Accepting(state_) && !a_->CanContinue(state_);
  return absl::OkStatus();
}

absl::Status ConstraintMatcher::error() const {
  absl::Status s = a_->status();
  if (!s.ok()) return s;
  return absl::FailedPreconditionError(absl::StrCat(
      "no token of the vocabulary can continue the output under the ", c_->spec.KindName(),
      " constraint"));
}

}  // namespace heavykv::grammar
