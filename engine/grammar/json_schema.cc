#include "engine/grammar/json_schema.h"

#include <algorithm>
#include <bit>
#include <chrono>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "engine/grammar/json_schema_compiler.h"
#include "engine/grammar/json_schema_set.h"
#include "engine/grammar/json_string_regex.h"
#include "engine/grammar/json_text.h"

namespace heavykv::grammar {
namespace json_schema_internal {

// Draft 3 and 4 validators take 1.0 for a number but not for an integer.
bool IsDraft4(const json& root) {
  if (!root.is_object() || !root.contains("$schema") || !root["$schema"].is_string()) return false;
  const std::string& s = root["$schema"].get_ref<const std::string&>();
  return s.find("draft-04") != std::string::npos || s.find("draft-03") != std::string::npos;
}

// A schema that only says which keys an object has: {required: [...]} and/or
// {not: {required: [...]}} (annotations aside). anyOf/oneOf lists of these compile as a
// condition on the set of keys present (CompileObject), not as alternatives.
bool IsPresenceOnly(const json& s) {
  if (!s.is_object() || (!s.contains("required") && !s.contains("not"))) return false;
  for (auto it = s.begin(); it != s.end(); ++it) {
    if (it.key() == "required") {
      if (!it.value().is_array()) return false;
      continue;
    }
    if (it.key() == "not") {
      const json& n = it.value();
      if (!n.is_object() || !n.contains("required") || !n["required"].is_array()) return false;
      for (auto jt = n.begin(); jt != n.end(); ++jt) {
        if (jt.key() != "required" && IsAssertionKeyword(jt.key())) return false;
      }
      continue;
    }
    if (IsAssertionKeyword(it.key())) return false;
  }
  return true;
}

bool AllPresenceOnly(const json& branches) {
  if (!branches.is_array() || branches.empty()) return false;
  for (const json& b : branches) {
    if (!IsPresenceOnly(b)) return false;
  }
  return true;
}

bool IsTrivialSchema(const json& s) { return s == json(true) || (s.is_object() && s.empty()); }

// allOf of `parts` without the trivial ones: a single schema stays itself (a bare $ref stays a
// reference, so recursion through it is a rule, not an expansion).
json AllOf(const std::vector<json>& parts) {
  json all = json::array();
  for (const json& p : parts) {
    if (!IsTrivialSchema(p) && std::find(all.begin(), all.end(), p) == all.end()) all.push_back(p);
  }
  if (all.empty()) return json(true);
  if (all.size() == 1) return all[0];
  return json{{"allOf", all}};
}

std::string Child(const std::string& ptr, std::string_view key) {
  std::string k;
  for (char c : key) {
    if (c == '~') {
      k += "~0";
    } else if (c == '/') {
      k += "~1";
    } else {
      k += c;
    }
  }
  return absl::StrCat(ptr, "/", k);
}

std::string Child(const std::string& ptr, size_t index) { return absl::StrCat(ptr, "/", index); }

// ---- any JSON ----

Expr Compiler::AnyValue() {
  if (any_value_ >= 0) return any_value_;
  const RuleId value = b_.DeclareRule("value");
  any_value_ = b_.Ref(value);
  Expr ws = t_.Ws();
  Expr member = b_.Seq({t_.AnyString(), t_.Colon(), any_value_});
  const RuleId object = b_.DeclareRule("object");
  b_.DefineRule(
      object,
      b_.Alt({b_.Seq({b_.Literal("{"), ws, b_.Literal("}")}),
              b_.Seq({b_.Literal("{"), ws, member, b_.Repeat(b_.Seq({t_.Comma(), member}), 0, -1),
                      ws, b_.Literal("}")})}));
  any_object_ = b_.Ref(object);
  Expr array =
      b_.Alt({b_.Seq({b_.Literal("["), ws, b_.Literal("]")}),
              b_.Seq({b_.Literal("["), ws, any_value_,
                      b_.Repeat(b_.Seq({t_.Comma(), any_value_}), 0, -1), ws, b_.Literal("]")})});
  b_.DefineRule(value, b_.Alt({any_object_, array, t_.AnyString(), t_.AnyNumber(),
                               b_.Literal("true"), b_.Literal("false"), b_.Literal("null")}));
  return any_value_;
}

// ---- the driver ----

absl::StatusOr<Expr> Compiler::Compile(const json& schema, const std::string& ptr, int depth) {
  if (depth > b_.limits().max_depth) {
    return absl::ResourceExhaustedError(absl::StrCat("the JSON Schema nests past the limit of ",
                                                     b_.limits().max_depth, " levels at ",
                                                     ptr.empty() ? "/" : ptr, " (max_depth)"));
  }
  if (std::chrono::steady_clock::now() > deadline_) {
    return absl::ResourceExhaustedError(absl::StrCat("the JSON Schema takes longer than ",
                                                     options_.max_compile_ms,
                                                     " ms to compile (max_compile_ms)"));
  }
  if (schema.is_boolean()) return schema.get<bool>() ? AnyValue() : b_.Nothing();
  if (!schema.is_object()) {
    return SchemaError("schema", ptr, "a schema must be an object or a boolean");
  }
  // A bare reference stays a rule (recursion); anything else is normalized first.
  if (IsBareRef(schema)) {
    if (!schema["$ref"].is_string()) return SchemaError("$ref", Child(ptr, "$ref"), "not a string");
    return CompileRef(schema["$ref"].get<std::string>(), Child(ptr, "$ref"), depth);
  }
  absl::StatusOr<json> normalized = schemas_.Normalize(schema, ptr, 0);
  if (!normalized.ok()) return normalized.status();
  if (normalized->is_boolean()) return normalized->get<bool>() ? AnyValue() : b_.Nothing();
  if (IsBareRef(*normalized)) return Compile(*normalized, ptr, depth + 1);
  return CompileNormalized(*normalized, ptr, depth);
}

absl::StatusOr<Expr> Compiler::CompileRef(const std::string& ref, const std::string& ptr,
                                          int depth) {
  absl::StatusOr<ResolvedRef> target = schemas_.Resolve(ref, ptr);
  if (!target.ok()) return target.status();
  if (auto it = ref_rules_.find(target->pointer); it != ref_rules_.end()) return it->second;
  if (++num_refs_ > 10'000) {
    return absl::ResourceExhaustedError("the JSON Schema has more than 10000 references");
  }
  const RuleId rule = b_.DeclareRule(absl::StrCat("ref", num_refs_));
  const Expr e = b_.Ref(rule);
  ref_rules_[target->pointer] = e;
  absl::StatusOr<Expr> body = Compile(*target->schema, target->pointer, depth + 1);
  if (!body.ok()) return body.status();
  b_.DefineRule(rule, *body);
  return e;
}

absl::StatusOr<Expr> Compiler::CompileNormalized(const json& s, const std::string& ptr, int depth) {
  // A finite set of values: each is checked against the whole schema (not, anyOf, if ...).
  if (s.contains("enum") || s.contains("const")) return CompileEnum(s, ptr);
  // if: true / false picks then / else once and for all.
  if (s.contains("if") && s["if"].is_boolean()) {
    json rest = s;
    const char* taken = s["if"].get<bool>() ? "then" : "else";
    const json branch = s.contains(taken) ? s[taken] : json(true);
    for (const char* kw : {"if", "then", "else"}) rest.erase(kw);
    absl::StatusOr<json> m = schemas_.MergeInto(rest, branch, Child(ptr, taken));
    if (!m.ok()) return m.status();
    return Compile(*m, ptr, depth + 1);
  }
  // Unsupported assertions first, whatever the instance's type.
  for (const char* kw : {"if", "$dynamicRef", "$recursiveRef", "dependentSchemas", "allOf"}) {
    if (s.contains(kw)) return SchemaError(kw, Child(ptr, kw), "is not supported");
  }
  // anyOf / oneOf: each branch with the rest of the schema.
  // oneOf of objects told apart by their required keys ({type: object, properties, required}):
  // every branch's property schemas apply to every present key (stricter: a value one branch
  // refuses is refused even where another branch is the one that matches), and then exactly one
  // branch matches when exactly one's required keys are present: a condition on the keys.
  if (s.contains("oneOf") && !AllPresenceOnly(s["oneOf"]) && s["oneOf"].is_array() &&
      s["oneOf"].size() >= 2) {
    bool key_branches = true;
    int typed = 0;
    for (const json& b : s["oneOf"]) {
      if (!b.is_object() || !b.contains("required") || !b["required"].is_array()) {
        key_branches = false;
        break;
      }
      for (auto it = b.begin(); it != b.end(); ++it) {
        const std::string& k = it.key();
        if (k == "type" && it.value() == json("object")) {
          ++typed;
        } else if (k != "properties" && k != "required" && IsAssertionKeyword(k)) {
          key_branches = false;
        }
      }
    }
    const int n = int(s["oneOf"].size());
    // Branches already disjoint (a discriminator's values) compile exactly as alternatives.
    const auto disjoint = [&]() -> bool {
      json base = s;
      base.erase("oneOf");
      std::vector<json> merged;
      for (size_t i = 0; i < s["oneOf"].size(); ++i) {
        absl::StatusOr<json> m = schemas_.MergeInto(base, s["oneOf"][i], ptr);
        if (!m.ok()) return false;
        merged.push_back(*std::move(m));
      }
      for (size_t i = 0; i < merged.size(); ++i) {
        for (size_t j = i + 1; j < merged.size(); ++j) {
          if (!schemas_.Disjoint(merged[i], merged[j])) return false;
        }
      }
      return true;
    };
    if (key_branches && (typed == 0 || typed == n) && !disjoint()) {
      json base = s;
      base.erase("oneOf");
      json presence = json::array();
      for (size_t i = 0; i < s["oneOf"].size(); ++i) {
        const json& b = s["oneOf"][i];
        json props = json::object();
        if (b.contains("properties")) props["properties"] = b["properties"];
        if (typed) props["type"] = "object";
        absl::StatusOr<json> m = schemas_.MergeInto(base, props, Child(Child(ptr, "oneOf"), i));
        if (!m.ok()) return m.status();
        base = *std::move(m);
        if (!base.is_object()) return Compile(base, ptr, depth + 1);
        presence.push_back(json{{"required", b["required"]}});
      }
      base["oneOf"] = presence;
      return Compile(base, ptr, depth + 1);
    }
  }
  for (const char* kw : {"anyOf", "oneOf"}) {
    if (!s.contains(kw) || AllPresenceOnly(s[kw])) continue;
    const json& branches = s[kw];
    if (!branches.is_array() || branches.empty()) {
      return SchemaError(kw, Child(ptr, kw), "must be a non-empty array");
    }
    json base = s;
    base.erase(kw);
    std::vector<json> merged;
    for (size_t i = 0; i < branches.size(); ++i) {
      absl::StatusOr<json> m = schemas_.MergeInto(base, branches[i], Child(Child(ptr, kw), i));
      if (!m.ok()) return m.status();
      merged.push_back(*std::move(m));
    }
    if (std::string_view(kw) == "oneOf") {
      for (size_t i = 0; i < merged.size(); ++i) {
        for (size_t j = i + 1; j < merged.size(); ++j) {
          if (!schemas_.Disjoint(merged[i], merged[j])) {
            return SchemaError("oneOf", Child(ptr, kw),
                               absl::StrCat("branches ", i, " and ", j,
                                            " may both match (only disjoint branches compile)"));
          }
        }
      }
    }
    std::vector<Expr> alts;
    for (size_t i = 0; i < merged.size(); ++i) {
      absl::StatusOr<Expr> e = Compile(merged[i], Child(Child(ptr, kw), i), depth + 1);
      if (!e.ok()) return e.status();
      alts.push_back(*e);
    }
    return b_.Alt(std::move(alts));
  }
  absl::StatusOr<uint32_t> types = TypesOf(s, ptr);
  if (!types.ok()) return types.status();
  std::vector<Expr> alts;
  if (*types & kNull) alts.push_back(b_.Literal("null"));
  if (*types & kBoolean) alts.push_back(b_.Alt({b_.Literal("true"), b_.Literal("false")}));
  if (*types & (kInteger | kFraction)) {
    absl::StatusOr<Expr> e = (*types & kInteger) ? CompileNumber(s, ptr, !(*types & kFraction))
                                                 : NonIntegerNumber(s, ptr);
    if (!e.ok()) return e.status();
    alts.push_back(*e);
  }
  if (*types & kString) {
    absl::StatusOr<Expr> e = CompileString(s, ptr);
    if (!e.ok()) return e.status();
    alts.push_back(*e);
  }
  if (*types & kArray) {
    absl::StatusOr<Expr> e = CompileArray(s, ptr, depth);
    if (!e.ok()) return e.status();
    alts.push_back(*e);
  }
  if (*types & kObject) {
    absl::StatusOr<Expr> e = CompileObject(s, ptr, depth);
    if (!e.ok()) return e.status();
    alts.push_back(*e);
  }
  return b_.Alt(std::move(alts));
}

absl::StatusOr<uint32_t> Compiler::TypesOf(const json& s, const std::string& ptr) {
  uint32_t types = kAllTypes;
  if (s.contains("type")) {
    absl::StatusOr<uint32_t> t = TypeMask(s["type"]);
    if (!t.ok()) return SchemaError("type", Child(ptr, "type"), t.status().message());
    types = *t;
  }
  if (s.contains("not")) {
    // Only `not` of types (and of nothing / everything, and of required keys) compiles.
    const json& n = s["not"];
    if (n.is_boolean()) {
      if (n.get<bool>()) types = 0;
    } else if (n.is_object() && n.empty()) {
      types = 0;
    } else if (n.is_object() && n.size() == 1 && n.contains("type")) {
      absl::StatusOr<uint32_t> t = TypeMask(n["type"]);
      if (!t.ok()) return SchemaError("not", Child(ptr, "not"), t.status().message());
      types &= ~*t;
    } else if (IsPresenceOnly(json{{"not", n}})) {
      types &= kObject;  // `required` holds for any non-object, so its `not` fails there
    } else {
      return SchemaError("not", Child(ptr, "not"),
                         "compiles only for `not: {type: ...}` or `not: {required: [...]}`");
    }
  }
  // Key conditions hold (required) or fail (not required) the same way for every non-object.
  for (const char* kw : {"anyOf", "oneOf"}) {
    if (!s.contains(kw) || !AllPresenceOnly(s[kw])) continue;
    int vacuous = 0;
    for (const json& b : s[kw]) vacuous += !b.contains("not");
    const bool non_objects = std::string_view(kw) == "anyOf" ? vacuous >= 1 : vacuous == 1;
    if (!non_objects) types &= kObject;
  }
  return types;
}

// ---- enum / const ----

absl::StatusOr<Expr> Compiler::CompileEnum(const json& s, const std::string& ptr) {
  // Draft 4's integer type takes 1 but not 1.0, though 1.0 == 1 for enum.
  bool integers_only = false;
  if (draft4_ && s.contains("type")) {
    absl::StatusOr<uint32_t> t = TypeMask(s["type"]);
    integers_only = t.ok() && !(*t & kFraction);
  }
  std::vector<json> values;
  std::string kw = s.contains("const") ? "const" : "enum";
  if (s.contains("const")) {
    values.push_back(s["const"]);
  } else {
    if (!s["enum"].is_array()) return SchemaError("enum", Child(ptr, "enum"), "not an array");
    for (const json& v : s["enum"]) values.push_back(v);
  }
  if (s.contains("const") && s.contains("enum")) {
    if (!s["enum"].is_array()) return SchemaError("enum", Child(ptr, "enum"), "not an array");
    bool found = false;
    for (const json& v : s["enum"]) found |= v == values[0];
    if (!found) values.clear();
  }
  std::vector<Expr> alts;
  std::vector<json> kept;
  for (const json& v : values) {
    // The value must pass the schema's other assertions too.
    absl::StatusOr<bool> ok = schemas_.ValueSatisfies(v, s, ptr, /*skip_enum=*/true);
    if (!ok.ok()) return ok.status();
    if (!*ok) continue;
    if (std::find(kept.begin(), kept.end(), v) != kept.end()) continue;
    kept.push_back(v);
    absl::StatusOr<Expr> e = CompileConst(v, 0, integers_only);
    if (!e.ok()) return e.status();
    alts.push_back(*e);
  }
  return b_.Alt(std::move(alts));
}

absl::StatusOr<Expr> Compiler::CompileConst(const json& v, int depth, bool integer_text) {
  if (depth > b_.limits().max_depth) {
    return absl::ResourceExhaustedError("a const value nests past the limit (max_depth)");
  }
  switch (v.type()) {
    case json::value_t::null:
      return b_.Literal("null");
    case json::value_t::boolean:
      return b_.Literal(v.get<bool>() ? "true" : "false");
    case json::value_t::string:
      return t_.StringLiteral(v.get_ref<const std::string&>());
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float:
      return t_.NumberLiteral(v, integer_text);
    case json::value_t::array: {
      if (v.empty()) return b_.Seq({b_.Literal("["), t_.Ws(), b_.Literal("]")});
      std::vector<Expr> items = {b_.Literal("["), t_.Ws()};
      for (size_t i = 0; i < v.size(); ++i) {
        if (i > 0) items.push_back(t_.Comma());
        absl::StatusOr<Expr> e = CompileConst(v[i], depth + 1);
        if (!e.ok()) return e.status();
        items.push_back(*e);
      }
      items.push_back(t_.Ws());
      items.push_back(b_.Literal("]"));
      return b_.Seq(std::move(items));
    }
    case json::value_t::object: {
      // {properties: {k: {const: v}}, required: all, additionalProperties: false}: any order.
      json schema = {{"type", "object"}, {"additionalProperties", false}};
      schema["properties"] = json::object();
      schema["required"] = json::array();
      for (auto it = v.begin(); it != v.end(); ++it) {
        schema["properties"][it.key()] = json{{"const", it.value()}};
        schema["required"].push_back(it.key());
      }
      return CompileObject(schema, "", depth + 1);
    }
    default:
      return b_.Nothing();
  }
}

// ---- strings ----

absl::StatusOr<Expr> Compiler::CompileString(const json& s, const std::string& ptr) {
  int64_t min = 0, max = -1;
  if (s.contains("minLength")) {
    absl::StatusOr<int64_t> n = NonNegativeInt(s["minLength"]);
    if (!n.ok()) return SchemaError("minLength", Child(ptr, "minLength"), n.status().message());
    if (*n > kMaxLength) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "minLength ", *n, " at ", Child(ptr, "minLength"), " is over the limit of ", kMaxLength));
    }
    min = *n;
  }
  if (s.contains("maxLength")) {
    absl::StatusOr<int64_t> n = NonNegativeInt(s["maxLength"]);
    if (!n.ok()) return SchemaError("maxLength", Child(ptr, "maxLength"), n.status().message());
    if (*n > kMaxLength) {
      // Past the limit, a bound this loose constrains nothing we can generate: take the string
      // up to the limit (fewer valid strings, never an invalid one).
      *n = kMaxLength;
    }
    max = *n;
  }
  if (max >= 0 && min > max) return b_.Nothing();
  bool lengths = min > 0 || max >= 0;
  std::optional<Expr> body;
  const bool format = s.contains("format") && IsCheckedFormat(s["format"]);
  if (s.contains("pattern")) {
    if (!s["pattern"].is_string()) {
      return SchemaError("pattern", Child(ptr, "pattern"), "not a string");
    }
    absl::StatusOr<StringRegex> re =
        CompileStringRegex(b_, s["pattern"].get<std::string>(), /*search=*/true, min, max);
    if (!re.ok()) {
      if (re.status().code() != absl::StatusCode::kInvalidArgument) return re.status();
      return SchemaError("pattern", Child(ptr, "pattern"), re.status().message());
    }
    if (format) {
      return SchemaError("pattern", Child(ptr, "pattern"), "does not compile together with format");
    }
    return b_.Seq({b_.Literal("\""), re->expr, b_.Literal("\"")});
  }
  if (format) {
    body = t_.FormatBody(s["format"].get<std::string>());
    if (!body) {
      return SchemaError(
          "format", Child(ptr, "format"),
          absl::StrCat("the format `", s["format"].get<std::string>(), "` is not supported"));
    }
    if (lengths) {
      const std::string& f = s["format"].get_ref<const std::string&>();
      const std::optional<std::pair<int64_t, int64_t>> range = FormatLengths(f);
      if (range && range->first >= min && (max < 0 || range->second <= max)) {
        lengths = false;  // every string of the format has an allowed length
      } else if (!FormatRegex(f).empty()) {
        absl::StatusOr<StringRegex> re =
            CompileStringRegex(b_, FormatRegex(f), /*search=*/true, min, max);
        if (!re.ok()) return re.status();
        return b_.Seq({b_.Literal("\""), re->expr, b_.Literal("\"")});
      } else {
        return SchemaError("format", Child(ptr, "format"),
                           "does not compile together with these minLength/maxLength");
      }
    }
  }
  if (body) return b_.Seq({b_.Literal("\""), *body, b_.Literal("\"")});
  if (lengths) return t_.StringOfLength(min, max);
  return t_.AnyString();
}

// ---- numbers ----

absl::StatusOr<Expr> Compiler::CompileNumber(const json& s, const std::string& ptr,
                                             bool integer_only) {
  std::optional<Bound> lo, hi;
  const auto tighten = [](std::optional<Bound>& cur, Bound b, bool is_lo) {
    if (!cur) {
      cur = b;
      return;
    }
    const int c = Decimal::Compare(b.value, cur->value);
    if ((is_lo && c > 0) || (!is_lo && c < 0) || (c == 0 && !b.inclusive)) cur = b;
  };
  for (const char* kw : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
    if (!s.contains(kw)) continue;
    const json& v = s[kw];
    if (v.is_boolean()) continue;  // draft 4's form, folded by Normalize
    std::optional<Decimal> d = Decimal::FromJson(v);
    if (!d) return SchemaError(kw, Child(ptr, kw), "must be a number");
    const std::string_view k = kw;
    tighten(k.find("inimum") != k.npos ? lo : hi, Bound{*d, k[0] != 'e'},
            k.find("inimum") != k.npos);
  }
  std::optional<int64_t> multiple;
  if (s.contains("multipleOf")) {
    const json& m = s["multipleOf"];
    std::optional<Decimal> d = Decimal::FromJson(m);
    if (!d || d->negative || (d->int_digits == "0" && d->frac_digits.empty())) {
      return SchemaError("multipleOf", Child(ptr, "multipleOf"), "must be a positive number");
    }
    if (!d->IsInteger() || d->int_digits.size() > 4) {
      return SchemaError("multipleOf", Child(ptr, "multipleOf"),
                         "compiles only for integers from 1 to 100");
    }
    multiple = std::stoll(d->int_digits);
    if (*multiple > 100) {
      return SchemaError("multipleOf", Child(ptr, "multipleOf"),
                         "compiles only for integers from 1 to 100");
    }
    integer_only = true;
  }
  if (!integer_only) return t_.NumberRange(lo, hi);
  std::optional<Decimal> ilo, ihi;
  if (lo) ilo = lo->inclusive ? lo->value.Ceil() : lo->value.Floor().PlusOne();
  if (hi) ihi = hi->inclusive ? hi->value.Floor() : hi->value.Ceil().MinusOne();
  if (multiple && *multiple > 1) {
    if (ilo || ihi) {
      return SchemaError("multipleOf", Child(ptr, "multipleOf"),
                         "does not compile together with bounds");
    }
    return t_.IntegerMultipleOf(int(*multiple));
  }
  return t_.IntegerRange(ilo, ihi);
}

// Numbers that are not integers (`not: {type: integer}`): a fraction with a digit other than 0.
absl::StatusOr<Expr> Compiler::NonIntegerNumber(const json& s, const std::string& ptr) {
  for (const char* kw :
       {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "multipleOf"}) {
    if (s.contains(kw)) {
      return SchemaError(kw, Child(ptr, kw), "does not compile for non-integer numbers only");
    }
  }
  Expr digit = b_.Bytes(ByteSet::Range('0', '9'));
  Expr int_part = b_.Alt(
      {b_.Literal("0"), b_.Seq({b_.Bytes(ByteSet::Range('1', '9')), b_.Repeat(digit, 0, -1)})});
  return b_.Seq({b_.Optional(b_.Literal("-")), int_part, b_.Literal("."),
                 b_.Repeat(b_.Literal("0"), 0, -1), b_.Bytes(ByteSet::Range('1', '9')),
                 b_.Repeat(digit, 0, -1)});
}

// ---- arrays ----

absl::StatusOr<Expr> Compiler::CompileArray(const json& s, const std::string& ptr, int depth) {
  std::vector<std::pair<const json*, std::string>> prefix;
  json rest = true;
  std::string rest_ptr = ptr;
  if (s.contains("prefixItems")) {
    if (!s["prefixItems"].is_array()) {
      return SchemaError("prefixItems", Child(ptr, "prefixItems"), "not an array");
    }
    for (size_t i = 0; i < s["prefixItems"].size(); ++i) {
      prefix.push_back({&s["prefixItems"][i], Child(Child(ptr, "prefixItems"), i)});
    }
    if (s.contains("items")) {
      rest = s["items"];
      rest_ptr = Child(ptr, "items");
    }
  } else if (s.contains("items") && s["items"].is_array()) {
    for (size_t i = 0; i < s["items"].size(); ++i) {
      prefix.push_back({&s["items"][i], Child(Child(ptr, "items"), i)});
    }
    if (s.contains("additionalItems")) {
      rest = s["additionalItems"];
      rest_ptr = Child(ptr, "additionalItems");
    }
  } else if (s.contains("items")) {
    rest = s["items"];
    rest_ptr = Child(ptr, "items");
  }
  int64_t min = 0, max = -1;
  for (const char* kw : {"minItems", "maxItems", "minContains", "maxContains"}) {
    if (!s.contains(kw)) continue;
    absl::StatusOr<int64_t> n = NonNegativeInt(s[kw]);
    if (!n.ok()) return SchemaError(kw, Child(ptr, kw), n.status().message());
    if (std::string_view(kw) == "minItems") min = *n;
    if (std::string_view(kw) == "maxItems") max = *n;
  }
  if (s.contains("contains")) {
    const json& c = s["contains"];
    if (!(c == json(true) || (c.is_object() && c.empty()))) {
      return SchemaError("contains", Child(ptr, "contains"), "compiles only when trivial");
    }
    int64_t min_contains = 1;
    if (s.contains("minContains")) min_contains = s["minContains"].get<int64_t>();
    min = std::max(min, min_contains);
    if (s.contains("maxContains")) {
      const int64_t mc = s["maxContains"].get<int64_t>();
      max = max < 0 ? mc : std::min(max, mc);
    }
  }
  if (s.contains("unevaluatedItems") && s["unevaluatedItems"] != json(true) &&
      !(prefix.empty() && s.contains("items"))) {
    return SchemaError("unevaluatedItems", Child(ptr, "unevaluatedItems"), "is not supported");
  }
  // A false item schema ends the array there.
  for (size_t i = 0; i < prefix.size(); ++i) {
    if (*prefix[i].first == json(false)) {
      max = max < 0 ? int64_t(i) : std::min<int64_t>(max, i);
      break;
    }
  }
  if (rest == json(false)) {
    max = max < 0 ? int64_t(prefix.size()) : std::min<int64_t>(max, prefix.size());
  }
  if (max >= 0 && min > max) return b_.Nothing();
  if (s.contains("uniqueItems") && s["uniqueItems"] == json(true) && !(max >= 0 && max <= 1)) {
    return SchemaError("uniqueItems", Child(ptr, "uniqueItems"),
                       "compiles only where at most one item is allowed");
  }
  const int64_t limit = b_.limits().max_repeat;
  if (min > limit || max > limit) {
    return absl::ResourceExhaustedError(absl::StrCat("minItems/maxItems at ",
                                                     ptr.empty() ? "/" : ptr, " over the limit of ",
                                                     limit, " (max_repeat)"));
  }
  std::vector<Expr> items;
  const size_t k = max >= 0 ? std::min<size_t>(prefix.size(), size_t(max)) : prefix.size();
  for (size_t i = 0; i < k; ++i) {
    absl::StatusOr<Expr> e = Compile(*prefix[i].first, prefix[i].second, depth + 1);
    if (!e.ok()) return e.status();
    items.push_back(*e);
  }
  Expr rest_expr = b_.Nothing();
  const bool more = max < 0 || max > int64_t(k);
  if (more) {
    absl::StatusOr<Expr> e = Compile(rest, rest_ptr, depth + 1);
    if (!e.ok()) return e.status();
    rest_expr = *e;
  }
  // tail(i): the items from index i on, each after a comma.
  const auto rest_tail = [&](int64_t from) {
    const int32_t lo = int32_t(std::max<int64_t>(0, min - from));
    const int32_t hi = max < 0 ? -1 : int32_t(max - from);
    return b_.Repeat(b_.Seq({t_.Comma(), rest_expr}), lo, hi);
  };
  Expr tail = more ? rest_tail(int64_t(k)) : b_.Empty();
  for (size_t i = k; i-- > 1;) {
    Expr next = b_.Seq({t_.Comma(), items[i], tail});
    tail = int64_t(i) >= min ? b_.Optional(next) : next;
  }
  Expr elements;  // one or more items
  if (k > 0) {
    elements = b_.Seq({items[0], tail});
  } else {
    elements = b_.Seq({rest_expr, more ? rest_tail(1) : b_.Empty()});
  }
  std::vector<Expr> alts;
  if (min == 0) alts.push_back(b_.Seq({b_.Literal("["), t_.Ws(), b_.Literal("]")}));
  if (max != 0) {
    alts.push_back(b_.Seq({b_.Literal("["), t_.Ws(), elements, t_.Ws(), b_.Literal("]")}));
  }
  return b_.Alt(std::move(alts));
}

}  // namespace json_schema_internal

using json_schema_internal::Compiler;
using json = nlohmann::ordered_json;
using Expr = GrammarBuilder::Expr;

absl::StatusOr<GrammarBuilder::Expr> CompileJsonSchema(GrammarBuilder& b, std::string_view schema,
                                                       const JsonSchemaOptions& options) {
  json root;
  try {
    root = json::parse(schema);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("the JSON Schema is not JSON: ", e.what()));
  }
  Compiler c(b, root, options);
  absl::StatusOr<Expr> e;
  try {
    e = c.Compile(root, "", 0);
  } catch (const json::exception& ex) {  // a keyword's value of an unexpected JSON type
    return absl::InvalidArgumentError(absl::StrCat("the JSON Schema is malformed: ", ex.what()));
  }
  if (!e.ok()) return e.status();
  if (!b.status().ok()) return b.status();
  return *e;
}

GrammarBuilder::Expr AnyJsonValue(GrammarBuilder& b, const JsonSchemaOptions& options) {
  Compiler c(b, json(true), options);
  return c.AnyValue();
}

GrammarBuilder::Expr AnyJsonObject(GrammarBuilder& b, const JsonSchemaOptions& options) {
  Compiler c(b, json(true), options);
  absl::StatusOr<Expr> e = absl::InternalError("");
  try {
    e = c.Compile(json{{"type", "object"}}, "", 0);
  } catch (const json::exception&) {
  }
  return e.ok() ? *e : b.Nothing();
}

}  // namespace heavykv::grammar
