#include <algorithm>
#include <bit>
#include <functional>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "engine/grammar/json_schema_compiler.h"
#include "engine/grammar/json_schema_set.h"
#include "engine/grammar/json_string_regex.h"
#include "engine/grammar/json_text.h"

namespace heavykv::grammar::json_schema_internal {

// ---- objects ----

absl::StatusOr<Expr> Compiler::CompileObject(const json& s, const std::string& ptr, int depth) {
  std::vector<std::string> keys;
  std::vector<json> values;
  std::vector<std::string> value_ptrs;
  const auto index_of = [&keys](const std::string& k) {
    return int(std::find(keys.begin(), keys.end(), k) - keys.begin());
  };
  if (s.contains("properties")) {
    if (!s["properties"].is_object()) {
      return SchemaError("properties", Child(ptr, "properties"), "not an object");
    }
    for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it) {
      keys.push_back(it.key());
      values.push_back(it.value());
      value_ptrs.push_back(Child(Child(ptr, "properties"), it.key()));
    }
  }
  json additional = options_.strict ? json(false) : json(true);
  std::string additional_ptr = Child(ptr, "additionalProperties");
  if (s.contains("additionalProperties")) {
    additional = s["additionalProperties"];
  } else if (s.contains("unevaluatedProperties")) {
    additional = s["unevaluatedProperties"];
    additional_ptr = Child(ptr, "unevaluatedProperties");
  }
  // patternProperties: (pattern, schema), the trivial ones dropped where keys are open anyway.
  std::vector<std::pair<std::string, json>> patterns;
  if (s.contains("patternProperties")) {
    const json& pp = s["patternProperties"];
    if (!pp.is_object()) {
      return SchemaError("patternProperties", Child(ptr, "patternProperties"), "not an object");
    }
    for (auto it = pp.begin(); it != pp.end(); ++it) {
      const bool trivial =
          it.value() == json(true) || (it.value().is_object() && it.value().empty());
      if (!trivial || additional == json(false)) patterns.push_back({it.key(), it.value()});
    }
  }
  // propertyNames: a string schema for every key; compiled as the key's grammar where no key is
  // listed (listed keys would need checking against it one by one).
  std::optional<json> names;
  if (s.contains("propertyNames") && !IsTrivialSchema(s["propertyNames"])) {
    names = s["propertyNames"];
    if (s.contains("properties") || s.contains("required") || !patterns.empty() ||
        additional == json(false)) {
      return SchemaError("propertyNames", Child(ptr, "propertyNames"),
                         "compiles only where no property is listed");
    }
  }
  std::vector<std::string> required;
  if (s.contains("required")) {
    if (!s["required"].is_array()) {
      return SchemaError("required", Child(ptr, "required"), "not an array");
    }
    for (const json& r : s["required"]) {
      if (!r.is_string()) return SchemaError("required", Child(ptr, "required"), "not a string");
      const std::string& k = r.get_ref<const std::string&>();
      if (std::find(required.begin(), required.end(), k) != required.end()) continue;
      required.push_back(k);
      if (index_of(k) == int(keys.size())) {
        // Required but not listed: an additional property, which must be allowed.
        if (additional == json(false)) return b_.Nothing();
        keys.push_back(k);
        values.push_back(additional);
        value_ptrs.push_back(additional_ptr);
      }
    }
  }
  // Dependencies among the listed keys (dependentRequired, draft 4-7 `dependencies` arrays).
  std::vector<std::pair<int, std::vector<int>>> deps;
  for (const char* kw : {"dependentRequired", "dependencies"}) {
    if (!s.contains(kw)) continue;
    const json& d = s[kw];
    if (!d.is_object()) return SchemaError(kw, Child(ptr, kw), "not an object");
    for (auto it = d.begin(); it != d.end(); ++it) {
      // {required: [...]} (annotations aside) says what an array says.
      json list = it.value();
      if (list.is_object() && list.contains("required") && list["required"].is_array()) {
        bool only_required = true;
        for (auto jt = list.begin(); jt != list.end(); ++jt) {
          only_required &= jt.key() == "required" || !IsAssertionKeyword(jt.key());
        }
        if (only_required) list = json(list["required"]);
      } else if (IsTrivialSchema(list)) {
        list = json::array();
      }
      if (!list.is_array()) {
        return SchemaError(kw, Child(Child(ptr, kw), it.key()), "compiles only as an array");
      }
      std::vector<int> needs;
      for (const json& r : list) {
        if (!r.is_string() || index_of(r.get<std::string>()) == int(keys.size())) {
          return SchemaError(kw, Child(Child(ptr, kw), it.key()),
                             "compiles only between properties the schema lists");
        }
        needs.push_back(index_of(r.get<std::string>()));
      }
      if (index_of(it.key()) == int(keys.size())) {
        if (additional == json(false)) continue;  // the key can never appear
        return SchemaError(kw, Child(Child(ptr, kw), it.key()),
                           "compiles only between properties the schema lists");
      }
      if (!needs.empty()) deps.push_back({index_of(it.key()), needs});
    }
  }
  // Conditions on which keys are present: anyOf/oneOf of required lists, not-required.
  struct Presence {
    std::vector<std::vector<int>> required, not_all;
    bool never = false;  // needs a key that can never be present
  };
  struct PresenceRule {
    bool one_of = false;
    std::vector<Presence> branches;
  };
  std::vector<PresenceRule> rules;
  const bool may_add_keys = additional != json(false) || !patterns.empty();
  const auto presence = [&](const json& b, const std::string& at) -> absl::StatusOr<Presence> {
    Presence p;
    const auto ids = [&](const json& list, bool& unknown) -> absl::StatusOr<std::vector<int>> {
      std::vector<int> out;
      for (const json& k : list) {
        if (!k.is_string()) return SchemaError("required", at, "not a string");
        const int i = index_of(k.get<std::string>());
        if (i == int(keys.size())) {
          if (may_add_keys) {
            return SchemaError("required", at,
                               "a key condition on a property the schema does not list");
          }
          unknown = true;
          continue;
        }
        out.push_back(i);
      }
      return out;
    };
    if (b.contains("required")) {
      bool unknown = false;
      absl::StatusOr<std::vector<int>> r = ids(b["required"], unknown);
      if (!r.ok()) return r.status();
      p.never |= unknown;
      p.required.push_back(*r);
    }
    if (b.contains("not")) {
      bool unknown = false;
      absl::StatusOr<std::vector<int>> r = ids(b["not"]["required"], unknown);
      if (!r.ok()) return r.status();
      if (!unknown) p.not_all.push_back(*r);  // a key that never comes: not-all always holds
    }
    return p;
  };
  for (const char* kw : {"anyOf", "oneOf"}) {
    if (!s.contains(kw) || !AllPresenceOnly(s[kw])) continue;
    PresenceRule rule;
    rule.one_of = std::string_view(kw) == "oneOf";
    for (size_t i = 0; i < s[kw].size(); ++i) {
      absl::StatusOr<Presence> p = presence(s[kw][i], Child(Child(ptr, kw), i));
      if (!p.ok()) return p.status();
      rule.branches.push_back(*p);
    }
    rules.push_back(rule);
  }
  if (s.contains("not") && IsPresenceOnly(json{{"not", s["not"]}})) {
    absl::StatusOr<Presence> p = presence(json{{"not", s["not"]}}, Child(ptr, "not"));
    if (!p.ok()) return p.status();
    rules.push_back(PresenceRule{false, {*p}});
  }
  int64_t min_props = 0, max_props = -1;
  for (const char* kw : {"minProperties", "maxProperties"}) {
    if (!s.contains(kw)) continue;
    absl::StatusOr<int64_t> n = NonNegativeInt(s[kw]);
    if (!n.ok()) return SchemaError(kw, Child(ptr, kw), n.status().message());
    (std::string_view(kw) == "minProperties" ? min_props : max_props) = *n;
  }
  const int n = int(keys.size());
  const bool any_order = !options_.ordered_properties && n <= kMaxAnyOrderProperties;
  const bool open = additional != json(false);
  const bool extras = open || !patterns.empty();  // members beyond the listed keys
  // minProperties up to the number of required keys always holds; 1 is "not empty".
  const bool need_nonempty = min_props >= 1 && required.empty();
  const bool counted = min_props > std::max<int64_t>(1, int64_t(required.size())) || max_props >= 0;
  if (counted && (extras ? n > 0 : !any_order)) {
    return SchemaError(max_props >= 0 ? "maxProperties" : "minProperties",
                       Child(ptr, max_props >= 0 ? "maxProperties" : "minProperties"),
                       "compiles only with no properties listed or additionalProperties false");
  }
  // A listed key that a pattern matches takes both schemas. Where only pattern keys may be
  // added, such a key's text is a pattern key too: that member then takes the listed key's
  // schema as well (stricter for the other pattern keys; a repeat of the key is harmless, but
  // would hide the key from key conditions, so those refuse).
  std::vector<json> listed_for_patterns;
  for (int i = 0; i < n; ++i) {
    std::vector<json> all = {values[i]};
    for (const auto& [pattern, schema] : patterns) {
      absl::StatusOr<bool> m = StringRegexMatches(pattern, keys[i]);
      if (!m.ok()) {
        return SchemaError("patternProperties", Child(Child(ptr, "patternProperties"), pattern),
                           m.status().message());
      }
      if (!*m) continue;
      if (!open) {
        if (!rules.empty() || !deps.empty()) {
          return SchemaError("patternProperties", Child(Child(ptr, "patternProperties"), pattern),
                             "matches a listed property that a key condition names");
        }
        listed_for_patterns.push_back(values[i]);
      }
      all.push_back(schema);
    }
    if (all.size() > 1) values[i] = AllOf(all);
  }
  // Members.
  std::vector<Expr> members(n);
  for (int i = 0; i < n; ++i) {
    absl::StatusOr<Expr> v = Compile(values[i], value_ptrs[i], depth + 1);
    if (!v.ok()) return v.status();
    members[i] = b_.Seq({t_.StringLiteral(keys[i]), t_.Colon(), *v});
  }
  Expr extra = b_.Nothing();
  if (open) {
    // Keys not listed: each must pass additionalProperties and every pattern's schema, which is
    // exact for the keys a pattern matches and stricter (never looser) for the others.
    std::vector<json> all = {additional};
    for (const auto& p : patterns) all.push_back(p.second);
    absl::StatusOr<Expr> v = Compile(AllOf(all), additional_ptr, depth + 1);
    if (!v.ok()) return v.status();
    Expr key = t_.CanonicalStringExcept(keys);
    if (names) {
      // Keys are strings: the names schema as a string schema.
      absl::StatusOr<json> as_string =
          schemas_.MergeInto(json{{"type", "string"}}, *names, Child(ptr, "propertyNames"));
      if (!as_string.ok()) return as_string.status();
      absl::StatusOr<Expr> k = Compile(*as_string, Child(ptr, "propertyNames"), depth + 1);
      if (!k.ok()) return k.status();
      key = *k;
    }
    extra = b_.Seq({key, t_.Colon(), *v});
  } else if (!patterns.empty()) {
    // Only keys a pattern matches.
    std::vector<Expr> key_alts;
    std::vector<json> all = listed_for_patterns;
    for (const auto& [pattern, schema] : patterns) {
      absl::StatusOr<StringRegex> re = CompileStringRegex(b_, pattern);
      if (!re.ok()) {
        return SchemaError("patternProperties", Child(Child(ptr, "patternProperties"), pattern),
                           re.status().message());
      }
      key_alts.push_back(re->expr);
      all.push_back(schema);
    }
    absl::StatusOr<Expr> v = Compile(AllOf(all), Child(ptr, "patternProperties"), depth + 1);
    if (!v.ok()) return v.status();
    extra =
        b_.Seq({b_.Literal("\""), b_.Alt(std::move(key_alts)), b_.Literal("\""), t_.Colon(), *v});
  }
  const Expr open_brace = b_.Seq({b_.Literal("{"), t_.Ws()});
  const Expr close_brace = b_.Seq({t_.Ws(), b_.Literal("}")});
  const Expr empty = b_.Seq({b_.Literal("{"), t_.Ws(), b_.Literal("}")});
  std::vector<bool> is_required(n, false);
  for (const std::string& r : required) is_required[index_of(r)] = true;

  if (n == 0 && extras) {
    // Any keys: count-bounded. A key may repeat here and a parser keeps one of its members,
    // so a count of members is an upper bound of the object's size: maxProperties holds, but
    // minProperties past 1 would not.
    if (min_props > 1) {
      return SchemaError("minProperties", Child(ptr, "minProperties"),
                         "compiles only up to 1 where any key may appear");
    }
    if (max_props == 0) return min_props == 0 ? empty : b_.Nothing();
    if (max_props >= 0 && min_props > max_props) return b_.Nothing();
    const int64_t limit = b_.limits().max_repeat;
    if (min_props > limit || max_props > limit) {
      return absl::ResourceExhaustedError(
          absl::StrCat("min/maxProperties at ", ptr.empty() ? "/" : ptr, " over the limit of ",
                       limit, " (max_repeat)"));
    }
    Expr more = b_.Repeat(b_.Seq({t_.Comma(), extra}), int32_t(std::max<int64_t>(0, min_props - 1)),
                          max_props < 0 ? -1 : int32_t(max_props - 1));
    Expr body = b_.Seq({open_brace, extra, more, close_brace});
    return min_props == 0 ? b_.Alt({empty, body}) : body;
  }

  // Whether the keys present (by listed index) meet required, dependencies and key conditions.
  const auto keys_ok = [&](const std::function<bool(int)>& present) {
    for (int i = 0; i < n; ++i) {
      if (is_required[i] && !present(i)) return false;
    }
    for (const auto& [k, needs] : deps) {
      if (!present(k)) continue;
      for (int j : needs) {
        if (!present(j)) return false;
      }
    }
    const auto all_in = [&](const std::vector<int>& ids) {
      for (int j : ids) {
        if (!present(j)) return false;
      }
      return true;
    };
    for (const PresenceRule& rule : rules) {
      int satisfied = 0;
      for (const Presence& p : rule.branches) {
        bool ok = !p.never;
        for (const auto& r : p.required) ok = ok && all_in(r);
        for (const auto& na : p.not_all) ok = ok && !all_in(na);
        satisfied += ok;
      }
      if (rule.one_of ? satisfied != 1 : satisfied == 0) return false;
    }
    return true;
  };

  if (any_order) {
    // Body(mask): one member not in `mask` (or an additional one), then After.
    const auto can_end = [&](uint32_t mask) {
      if (!keys_ok([mask](int i) { return (mask >> i & 1) != 0; })) return false;
      const int count = std::popcount(mask);
      if (!extras && (count < min_props || (max_props >= 0 && count > max_props))) return false;
      return true;
    };
    std::map<uint32_t, RuleId> body_rules;
    std::vector<uint32_t> todo;
    const auto body_ref = [&](uint32_t mask) {
      auto [it, fresh] = body_rules.try_emplace(mask, -1);
      if (fresh) {
        it->second = b_.DeclareRule(absl::StrCat("obj_", mask));
        todo.push_back(mask);
      }
      return b_.Ref(it->second);
    };
    const auto after = [&](uint32_t mask) {
      std::vector<Expr> alts;
      if (can_end(mask)) alts.push_back(b_.Empty());
      const bool room = extras || max_props < 0 || std::popcount(mask) < max_props;
      const bool any_left = extras || std::popcount(mask) < n;
      if (room && any_left) alts.push_back(b_.Seq({t_.Comma(), body_ref(mask)}));
      return b_.Alt(std::move(alts));
    };
    std::vector<Expr> start;
    if (can_end(0) && !need_nonempty) start.push_back(empty);
    if (max_props != 0) start.push_back(b_.Seq({open_brace, body_ref(0), close_brace}));
    while (!todo.empty()) {
      const uint32_t mask = todo.back();
      todo.pop_back();
      std::vector<Expr> alts;
      for (int i = 0; i < n; ++i) {
        if (!(mask >> i & 1)) alts.push_back(b_.Seq({members[i], after(mask | (1u << i))}));
      }
      if (extras) alts.push_back(b_.Seq({extra, after(mask)}));
      b_.DefineRule(body_rules[mask], b_.Alt(std::move(alts)));
    }
    return b_.Alt(std::move(start));
  }

  // Many properties: any order, each key any number of times, the keys that required,
  // dependencies or key conditions name tracked as a set. A repeated key is no risk to
  // validity: every occurrence's value passes that key's schema, and a JSON parser keeps one of
  // them (Python's the last), which then passes too; presence does not change with repeats
  // either. Only counts past "not empty" need each key once, and those refuse here.
  std::vector<int> tracked;  // listed indices; bit j of a mask is tracked[j]
  std::vector<int> bit_of(n, -1);
  const auto track = [&](int i) {
    if (bit_of[i] < 0) {
      bit_of[i] = int(tracked.size());
      tracked.push_back(i);
    }
  };
  for (int i = 0; i < n; ++i) {
    if (is_required[i]) track(i);
  }
  for (const auto& [k, needs] : deps) {
    track(k);
    for (int j : needs) track(j);
  }
  for (const PresenceRule& rule : rules) {
    for (const Presence& p : rule.branches) {
      for (const auto& ids : p.required) {
        for (int j : ids) track(j);
      }
      for (const auto& ids : p.not_all) {
        for (int j : ids) track(j);
      }
    }
  }
  const int r = int(tracked.size());
  if (!options_.ordered_properties && r <= kMaxTracked && !counted) {
    std::vector<Expr> free_alts;
    for (int i = 0; i < n; ++i) {
      if (bit_of[i] < 0) free_alts.push_back(members[i]);
    }
    if (extras) free_alts.push_back(extra);
    const Expr free = b_.Alt(std::move(free_alts));
    const auto can_end = [&](uint32_t mask) {
      return keys_ok([&](int i) { return bit_of[i] >= 0 && (mask >> bit_of[i] & 1) != 0; });
    };
    std::map<uint32_t, RuleId> body_rules;
    std::vector<uint32_t> todo;
    const auto body_ref = [&](uint32_t mask) {
      auto [it, fresh] = body_rules.try_emplace(mask, -1);
      if (fresh) {
        it->second = b_.DeclareRule(absl::StrCat("keys_", mask));
        todo.push_back(mask);
      }
      return b_.Ref(it->second);
    };
    const auto after = [&](uint32_t mask) {
      std::vector<Expr> alts;
      if (can_end(mask)) alts.push_back(b_.Empty());
      alts.push_back(b_.Seq({t_.Comma(), body_ref(mask)}));
      return b_.Alt(std::move(alts));
    };
    std::vector<Expr> start;
    if (can_end(0) && !need_nonempty) start.push_back(empty);
    start.push_back(b_.Seq({open_brace, body_ref(0), close_brace}));
    while (!todo.empty()) {
      const uint32_t mask = todo.back();
      todo.pop_back();
      std::vector<Expr> alts;
      for (int j = 0; j < r; ++j) {
        alts.push_back(b_.Seq({members[tracked[j]], after(mask | (1u << j))}));
      }
      alts.push_back(b_.Seq({free, after(mask)}));
      b_.DefineRule(body_rules[mask], b_.Alt(std::move(alts)));
    }
    return b_.Alt(std::move(start));
  }
  if (!rules.empty() || !deps.empty()) {
    return SchemaError(
        !deps.empty() ? (s.contains("dependentRequired") ? "dependentRequired" : "dependencies")
        : s.contains("oneOf") ? "oneOf"
        : s.contains("anyOf") ? "anyOf"
                              : "not",
        ptr, "key conditions compile only on up to 8 keys");
  }
  // In the schema's order, each at most once, additional members anywhere.
  // next(i): a member among keys i.. (or an additional one), then then(...).
  std::vector<RuleId> next(n + 1);
  for (int i = 0; i <= n; ++i) next[i] = b_.DeclareRule(absl::StrCat("seq", i));
  std::vector<bool> end_ok(n + 1, true);  // no required key at i or later
  for (int i = n - 1; i >= 0; --i) end_ok[i] = end_ok[i + 1] && !is_required[i];
  const auto then = [&](int i) {
    std::vector<Expr> alts;
    if (end_ok[i]) alts.push_back(b_.Empty());
    if (i < n || extras) alts.push_back(b_.Seq({t_.Comma(), b_.Ref(next[i])}));
    return b_.Alt(std::move(alts));
  };
  for (int i = 0; i <= n; ++i) {
    std::vector<Expr> alts;
    if (i < n) {
      alts.push_back(b_.Seq({members[i], then(i + 1)}));
      if (!is_required[i]) alts.push_back(b_.Ref(next[i + 1]));
    }
    if (extras) alts.push_back(b_.Seq({extra, then(i)}));
    b_.DefineRule(next[i], b_.Alt(std::move(alts)));
  }
  std::vector<Expr> start;
  if (end_ok[0] && !need_nonempty) start.push_back(empty);
  start.push_back(b_.Seq({open_brace, b_.Ref(next[0]), close_brace}));
  return b_.Alt(std::move(start));
}

}  // namespace heavykv::grammar::json_schema_internal
