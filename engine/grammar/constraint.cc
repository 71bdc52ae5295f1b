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
      std::vector<GrammarBuilder::Expr> alts;
      for (const std::string& c : spec.choices) alts.push_back(b.Literal(c));
      body = b.Alt(std::move(alts));
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
    pending_ += v.bytes(token);
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
