#include "engine/grammar/json_schema_set.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/json_string_regex.h"
#include "engine/grammar/json_text.h"

namespace heavykv::grammar {
namespace {

using json = nlohmann::ordered_json;

constexpr int kMaxInlineDepth = 32;

}  // namespace

bool IsAssertionKeyword(std::string_view k) {
  static const char* const kKeywords[] = {"type",
                                          "enum",
                                          "const",
                                          "multipleOf",
                                          "maximum",
                                          "exclusiveMaximum",
                                          "minimum",
                                          "exclusiveMinimum",
                                          "maxLength",
                                          "minLength",
                                          "pattern",
                                          "maxItems",
                                          "minItems",
                                          "uniqueItems",
                                          "maxContains",
                                          "minContains",
                                          "contains",
                                          "items",
                                          "prefixItems",
                                          "additionalItems",
                                          "unevaluatedItems",
                                          "maxProperties",
                                          "minProperties",
                                          "required",
                                          "dependentRequired",
                                          "dependencies",
                                          "properties",
                                          "patternProperties",
                                          "additionalProperties",
                                          "unevaluatedProperties",
                                          "propertyNames",
                                          "dependentSchemas",
                                          "allOf",
                                          "anyOf",
                                          "oneOf",
                                          "not",
                                          "if",
                                          "then",
                                          "else",
                                          "$ref",
                                          "$dynamicRef",
                                          "$recursiveRef",
                                          "format"};
  for (const char* kw : kKeywords) {
    if (k == kw) return true;
  }
  return false;
}

namespace {

bool IsAssertion(std::string_view k) { return IsAssertionKeyword(k); }

std::string Child(const std::string& ptr, std::string_view key) {
  std::string k;
  for (char c : key) k += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return absl::StrCat(ptr, "/", k);
}

bool IsTrivial(const json& s) { return s == json(true) || (s.is_object() && s.empty()); }

std::string PercentDecode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(uint8_t(s[i + 1])) &&
        std::isxdigit(uint8_t(s[i + 2]))) {
      out += char(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

const json* FindAnchor(const json& s, const std::string& name, const std::string& at,
                       std::string& found, int depth) {
  if (depth > 64) return nullptr;
  if (s.is_object()) {
    if ((s.contains("$anchor") && s["$anchor"] == json(name)) ||
        (s.contains("$id") && s["$id"] == json("#" + name)) ||
        (s.contains("id") && s["id"] == json("#" + name))) {
      found = at;
      return &s;
    }
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (it.key() == "enum" || it.key() == "const") continue;
      if (const json* r = FindAnchor(it.value(), name, Child(at, it.key()), found, depth + 1)) {
        return r;
      }
    }
  } else if (s.is_array()) {
    for (size_t i = 0; i < s.size(); ++i) {
      if (const json* r = FindAnchor(s[i], name, absl::StrCat(at, "/", i), found, depth + 1)) {
        return r;
      }
    }
  }
  return nullptr;
}

// Whether a $ref sits under a nested $id that changes the base URI.
bool RefUnderNestedBase(const json& s, bool under, int depth) {
  if (depth > 64) return true;
  if (s.is_object()) {
    if (depth > 0) {
      for (const char* id : {"$id", "id"}) {
        if (s.contains(id) && s[id].is_string() && !s[id].get<std::string>().starts_with("#")) {
          under = true;
        }
      }
    }
    if (under && s.contains("$ref") && s["$ref"].is_string()) return true;
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (it.key() == "enum" || it.key() == "const") continue;
      if (RefUnderNestedBase(it.value(), under, depth + 1)) return true;
    }
  } else if (s.is_array()) {
    for (const json& e : s) {
      if (RefUnderNestedBase(e, under, depth + 1)) return true;
    }
  }
  return false;
}

json TypeJson(uint32_t mask) {
  json out = json::array();
  if (mask & kNull) out.push_back("null");
  if (mask & kBoolean) out.push_back("boolean");
  if (mask & kObject) out.push_back("object");
  if (mask & kArray) out.push_back("array");
  if (mask & kString) out.push_back("string");
  if ((mask & (kInteger | kFraction)) == (kInteger | kFraction)) {
    out.push_back("number");
  } else if (mask & kInteger) {
    out.push_back("integer");
  } else if (mask & kFraction) {
    return nullptr;  // non-integer numbers only: no type names them
  }
  return out;
}

int64_t CodePointCount(std::string_view s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace

absl::Status SchemaError(absl::string_view keyword, const std::string& ptr, absl::string_view why) {
  absl::Status s = absl::InvalidArgumentError(
      absl::StrCat("JSON Schema keyword `", keyword, "` at ", ptr.empty() ? "/" : ptr, ": ", why));
  s.SetPayload(kSchemaParamPayload, absl::Cord(ptr.empty() ? "/" : ptr));
  return s;
}

bool IsBareRef(const json& s) {
  if (!s.is_object() || !s.contains("$ref")) return false;
  for (auto it = s.begin(); it != s.end(); ++it) {
    if (it.key() != "$ref" && IsAssertion(it.key())) return false;
  }
  return true;
}

absl::StatusOr<uint32_t> TypeMask(const json& type) {
  const auto one = [](const json& t) -> absl::StatusOr<uint32_t> {
    if (!t.is_string()) return absl::InvalidArgumentError("a type must be a string");
    const std::string& n = t.get_ref<const std::string&>();
    if (n == "null") return kNull;
    if (n == "boolean") return kBoolean;
    if (n == "object") return kObject;
    if (n == "array") return kArray;
    if (n == "string") return kString;
    if (n == "integer") return kInteger;
    if (n == "number") return kInteger | kFraction;
    return absl::InvalidArgumentError(absl::StrCat("unknown type `", n, "`"));
  };
  if (!type.is_array()) return one(type);
  uint32_t mask = 0;
  for (const json& t : type) {
    absl::StatusOr<uint32_t> m = one(t);
    if (!m.ok()) return m.status();
    mask |= *m;
  }
  return mask;
}

uint32_t JsonTypeOf(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return kNull;
    case json::value_t::boolean:
      return kBoolean;
    case json::value_t::object:
      return kObject;
    case json::value_t::array:
      return kArray;
    case json::value_t::string:
      return kString;
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return kInteger;
    case json::value_t::number_float: {
      const double d = v.get<double>();
      return std::isfinite(d) && d == std::floor(d) ? kInteger : kFraction;
    }
    default:
      return 0;
  }
}

absl::StatusOr<int64_t> NonNegativeInt(const json& v) {
  if (v.is_number_unsigned()) return int64_t(std::min<uint64_t>(v.get<uint64_t>(), INT64_MAX));
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return v.get<int64_t>();
  if (v.is_number_float() && v.get<double>() >= 0 && v.get<double>() < 9e18 &&
      v.get<double>() == std::floor(v.get<double>())) {
    return int64_t(v.get<double>());
  }
  return absl::InvalidArgumentError("must be a non-negative integer");
}

bool IsCheckedFormat(const json& format) {
  static const char* const kChecked[] = {"email",
                                         "idn-email",
                                         "hostname",
                                         "idn-hostname",
                                         "ipv4",
                                         "ipv6",
                                         "iri",
                                         "iri-reference",
                                         "uri",
                                         "uri-reference",
                                         "uri-template",
                                         "date-time",
                                         "date",
                                         "time",
                                         "regex",
                                         "json-pointer",
                                         "relative-json-pointer",
                                         "color",
                                         "duration",
                                         "uuid"};
  if (!format.is_string()) return false;
  for (const char* f : kChecked) {
    if (format == json(f)) return true;
  }
  return false;
}

// ---- SchemaSet ----

SchemaSet::SchemaSet(const json& root) : root_(root) {
  if (root.is_object()) {
    for (const char* id : {"$id", "id"}) {
      if (root.contains(id) && root[id].is_string()) {
        root_id_ = root[id].get<std::string>();
        if (const size_t h = root_id_.find('#'); h != std::string::npos) root_id_.resize(h);
      }
    }
  }
  nested_bases_with_refs_ = RefUnderNestedBase(root, false, 0);
}

absl::StatusOr<ResolvedRef> SchemaSet::Resolve(const std::string& ref,
                                               const std::string& ptr) const {
  const size_t hash = ref.find('#');
  const std::string base = ref.substr(0, hash);
  const std::string frag = hash == std::string::npos ? "" : ref.substr(hash + 1);
  if (!base.empty() && base != root_id_) {
    return SchemaError("$ref", ptr, absl::StrCat("`", ref, "` is not a local reference"));
  }
  if (nested_bases_with_refs_) {
    return SchemaError("$ref", ptr, "references under a nested $id are not supported");
  }
  if (frag.empty()) return ResolvedRef{&root_, ""};
  if (frag[0] != '/') {
    std::string found;
    const json* s = FindAnchor(root_, frag, "", found, 0);
    if (!s) return SchemaError("$ref", ptr, absl::StrCat("no anchor `", frag, "`"));
    return ResolvedRef{s, found};
  }
  const std::string decoded = PercentDecode(frag);
  const json* cur = &root_;
  std::string at;
  size_t pos = 1;
  while (true) {
    const size_t slash = decoded.find('/', pos);
    std::string token =
        decoded.substr(pos, slash == std::string::npos ? std::string::npos : slash - pos);
    std::string key;
    for (size_t i = 0; i < token.size(); ++i) {
      if (token[i] == '~' && i + 1 < token.size() && (token[i + 1] == '0' || token[i + 1] == '1')) {
        key += token[i + 1] == '0' ? '~' : '/';
        ++i;
      } else {
        key += token[i];
      }
    }
    if (cur->is_object() && cur->contains(key)) {
      cur = &(*cur)[key];
    } else if (cur->is_array() && !key.empty() &&
               key.find_first_not_of("0123456789") == std::string::npos &&
               std::stoull(key) < cur->size()) {
      cur = &(*cur)[std::stoull(key)];
    } else {
      return SchemaError("$ref", ptr, absl::StrCat("`", ref, "` points at nothing"));
    }
    at = Child(at, key);
    if (slash == std::string::npos) break;
    pos = slash + 1;
  }
  return ResolvedRef{cur, at};
}

absl::StatusOr<json> SchemaSet::Inline(const json& s, const std::string& ptr, int depth) const {
  if (!IsBareRef(s)) return Normalize(s, ptr, depth);
  if (!s["$ref"].is_string()) return SchemaError("$ref", Child(ptr, "$ref"), "not a string");
  absl::StatusOr<ResolvedRef> r = Resolve(s["$ref"].get<std::string>(), Child(ptr, "$ref"));
  if (!r.ok()) return r.status();
  return Inline(*r->schema, r->pointer, depth + 1);
}

absl::Status SchemaSet::Expired() const {
  if (std::chrono::steady_clock::now() <= deadline_) return absl::OkStatus();
  return absl::ResourceExhaustedError("the JSON Schema takes too long to compile (max_compile_ms)");
}

absl::StatusOr<json> SchemaSet::Normalize(const json& s, const std::string& ptr, int depth) const {
  if (absl::Status e = Expired(); !e.ok()) return e;
  if (depth > kMaxInlineDepth) {
    return absl::ResourceExhaustedError(absl::StrCat("merging allOf/$ref at ",
                                                     ptr.empty() ? "/" : ptr, " goes deeper than ",
                                                     kMaxInlineDepth, " references (max_depth)"));
  }
  if (!s.is_object()) return s;
  json r = s;
  for (const char* pair : {"Minimum", "Maximum"}) {
    const std::string ex = absl::StrCat("exclusive", pair);
    const std::string plain = pair[1] == 'i' ? "minimum" : "maximum";
    if (r.contains(ex) && r[ex].is_boolean()) {
      if (r[ex].get<bool>() && r.contains(plain)) {
        r[ex] = r[plain];
        r.erase(plain);
      } else {
        r.erase(ex);
      }
    }
  }
  // The schema's own unevaluatedProperties sees what its allOf/$ref evaluate: keep it aside.
  json unevaluated;
  const bool has_unevaluated = r.contains("unevaluatedProperties");
  if (has_unevaluated) {
    unevaluated = r["unevaluatedProperties"];
    r.erase("unevaluatedProperties");
  }
  if (r.contains("$ref") && !IsBareRef(s)) {
    if (!r["$ref"].is_string()) return SchemaError("$ref", Child(ptr, "$ref"), "not a string");
    absl::StatusOr<ResolvedRef> target = Resolve(r["$ref"].get<std::string>(), Child(ptr, "$ref"));
    if (!target.ok()) return target.status();
    absl::StatusOr<json> t = Inline(*target->schema, target->pointer, depth + 1);
    if (!t.ok()) return t.status();
    r.erase("$ref");
    absl::StatusOr<json> m = Merge(std::move(r), *std::move(t), ptr, depth + 1);
    if (!m.ok()) return m.status();
    r = *std::move(m);
    if (!r.is_object()) return r;
  }
  if (r.contains("allOf")) {
    const json branches = r["allOf"];
    if (!branches.is_array()) return SchemaError("allOf", Child(ptr, "allOf"), "not an array");
    r.erase("allOf");
    for (size_t i = 0; i < branches.size(); ++i) {
      const std::string bp = absl::StrCat(Child(ptr, "allOf"), "/", i);
      absl::StatusOr<json> nb = Inline(branches[i], bp, depth + 1);
      if (!nb.ok()) return nb.status();
      absl::StatusOr<json> m = Merge(std::move(r), *std::move(nb), bp, depth + 1);
      if (!m.ok()) return m.status();
      r = *std::move(m);
      if (!r.is_object()) return r;
    }
  }
  if (has_unevaluated) {
    if (r.contains("anyOf") || r.contains("oneOf") || r.contains("not") || r.contains("if") ||
        r.contains("patternProperties") || r.contains("dependentSchemas") ||
        (r.contains("dependencies") && !r.contains("additionalProperties"))) {
      // Applicators left: the branches' properties count as evaluated; keep the keyword for
      // MergeInto to place once a branch is chosen.
      r["unevaluatedProperties"] = unevaluated;
    } else if (!r.contains("additionalProperties")) {
      r["additionalProperties"] = unevaluated;
    }
  }
  return r;
}

absl::StatusOr<json> SchemaSet::MergeInto(const json& base, const json& branch,
                                          const std::string& ptr) const {
  json all = base;
  if (!all.is_object()) return base;
  bool asserts = false;
  for (auto it = all.begin(); it != all.end(); ++it) asserts |= IsAssertion(it.key());
  if (!asserts) return branch;  // a bare $ref branch stays a reference (recursion)
  json branches = json::array();
  branches.push_back(branch);
  if (all.contains("allOf")) {
    for (const json& b : all["allOf"]) branches.push_back(b);
  }
  all["allOf"] = branches;
  absl::StatusOr<json> r = Normalize(all, ptr, 0);
  return r;
}

absl::StatusOr<json> SchemaSet::Merge(json a, json b, const std::string& ptr, int depth) const {
  if (absl::Status e = Expired(); !e.ok()) return e;
  if (depth > kMaxInlineDepth) {
    return absl::ResourceExhaustedError(absl::StrCat("merging allOf/$ref at ",
                                                     ptr.empty() ? "/" : ptr, " goes deeper than ",
                                                     kMaxInlineDepth, " levels (max_depth)"));
  }
  if (a.is_boolean()) return a.get<bool>() ? b : a;
  if (b.is_boolean()) return b.get<bool>() ? a : b;
  if (!a.is_object() || !b.is_object()) return SchemaError("allOf", ptr, "not a schema");
  if (IsBareRef(a)) {
    absl::StatusOr<json> x = Inline(a, ptr, depth + 1);
    if (!x.ok()) return x.status();
    a = *std::move(x);
    if (!a.is_object()) return Merge(a, b, ptr, depth + 1);
  }
  if (IsBareRef(b)) {
    absl::StatusOr<json> x = Inline(b, ptr, depth + 1);
    if (!x.ok()) return x.status();
    b = *std::move(x);
    if (!b.is_object()) return Merge(a, b, ptr, depth + 1);
  }
  const auto number = [](const json& v) { return Decimal::FromJson(v); };
  // unevaluated* sees only what its own schema evaluates: merged with another side's
  // properties or items it would see those too.
  for (const auto& [x, y] : {std::pair<const json*, const json*>{&a, &b}, {&b, &a}}) {
    const bool y_obj = y->contains("properties") || y->contains("patternProperties") ||
                       y->contains("additionalProperties") || y->contains("unevaluatedProperties");
    const bool y_arr = y->contains("items") || y->contains("prefixItems") ||
                       y->contains("additionalItems") || y->contains("unevaluatedItems") ||
                       y->contains("contains");
    if (x->contains("unevaluatedProperties") && y_obj) {
      return SchemaError("unevaluatedProperties", ptr, "does not merge (allOf)");
    }
    if (x->contains("unevaluatedItems") && y_arr) {
      return SchemaError("unevaluatedItems", ptr, "does not merge (allOf)");
    }
  }
  json r = a;
  // Object keywords that interact: a key only one side lists must pass the other side's
  // additionalProperties.
  const bool a_obj = a.contains("properties") || a.contains("additionalProperties") ||
                     a.contains("patternProperties");
  const bool b_obj = b.contains("properties") || b.contains("additionalProperties") ||
                     b.contains("patternProperties");
  if (a_obj && b_obj) {
    // patternProperties on one side merge when neither side has additionalProperties: then a
    // key outside the properties meets the same pattern schemas (and nothing else) either way.
    json patterns;
    if (a.contains("patternProperties") || b.contains("patternProperties")) {
      const bool one_side = a.contains("patternProperties") != b.contains("patternProperties");
      if (!one_side || a.contains("additionalProperties") || b.contains("additionalProperties")) {
        return SchemaError("patternProperties", ptr, "does not merge (allOf)");
      }
      patterns = a.contains("patternProperties") ? a["patternProperties"] : b["patternProperties"];
      a.erase("patternProperties");
      b.erase("patternProperties");
      r.erase("patternProperties");
    }
    json props = json::object();
    const json empty = json::object();
    const json& pa = a.contains("properties") ? a["properties"] : empty;
    const json& pb = b.contains("properties") ? b["properties"] : empty;
    const json add_a = a.contains("additionalProperties") ? a["additionalProperties"] : json(true);
    const json add_b = b.contains("additionalProperties") ? b["additionalProperties"] : json(true);
    for (auto it = pa.begin(); it != pa.end(); ++it) {
      absl::StatusOr<json> m = Merge(it.value(), pb.contains(it.key()) ? pb[it.key()] : add_b,
                                     Child(Child(ptr, "properties"), it.key()), depth + 1);
      if (!m.ok()) return m.status();
      props[it.key()] = *std::move(m);
    }
    for (auto it = pb.begin(); it != pb.end(); ++it) {
      if (pa.contains(it.key())) continue;
      absl::StatusOr<json> m =
          Merge(add_a, it.value(), Child(Child(ptr, "properties"), it.key()), depth + 1);
      if (!m.ok()) return m.status();
      props[it.key()] = *std::move(m);
    }
    absl::StatusOr<json> add = Merge(add_a, add_b, Child(ptr, "additionalProperties"), depth + 1);
    if (!add.ok()) return add.status();
    r["properties"] = props;
    if (*add != json(true)) r["additionalProperties"] = *add;
    if (!patterns.is_null()) r["patternProperties"] = patterns;
    a.erase("properties");
    a.erase("additionalProperties");
    b.erase("properties");
    b.erase("additionalProperties");
  }
  const bool a_arr =
      a.contains("items") || a.contains("prefixItems") || a.contains("additionalItems");
  const bool b_arr =
      b.contains("items") || b.contains("prefixItems") || b.contains("additionalItems");
  if (a_arr && b_arr) {
    const bool simple = !a.contains("prefixItems") && !b.contains("prefixItems") &&
                        a.contains("items") && b.contains("items") && !a["items"].is_array() &&
                        !b["items"].is_array();
    if (!simple && !(a["items"] == b["items"] &&
                     a.value("prefixItems", json()) == b.value("prefixItems", json()) &&
                     a.value("additionalItems", json()) == b.value("additionalItems", json()))) {
      return SchemaError("items", ptr, "tuple item lists do not merge (allOf)");
    }
    if (simple) {
      absl::StatusOr<json> m = Merge(a["items"], b["items"], Child(ptr, "items"), depth + 1);
      if (!m.ok()) return m.status();
      r["items"] = *m;
      b.erase("items");
    }
  }
  for (auto it = b.begin(); it != b.end(); ++it) {
    const std::string& k = it.key();
    const json& vb = it.value();
    if (!r.contains(k)) {
      if (a_obj && b_obj && (k == "properties" || k == "additionalProperties")) continue;
      r[k] = vb;
      continue;
    }
    const json va = r[k];
    if (va == vb || !IsAssertion(k)) continue;
    const std::string kp = Child(ptr, k);
    if (k == "type") {
      absl::StatusOr<uint32_t> ta = TypeMask(va), tb = TypeMask(vb);
      if (!ta.ok()) return SchemaError(k, kp, ta.status().message());
      if (!tb.ok()) return SchemaError(k, kp, tb.status().message());
      const json t = TypeJson(*ta & *tb);
      if (t.is_null()) return SchemaError(k, kp, "the types do not intersect in a type name");
      if (t.empty()) return json(false);
      r[k] = t;
    } else if (k == "required") {
      json u = va;
      for (const json& x : vb) {
        if (std::find(u.begin(), u.end(), x) == u.end()) u.push_back(x);
      }
      r[k] = u;
    } else if (k == "enum") {
      json both = json::array();
      for (const json& x : va) {
        if (std::find(vb.begin(), vb.end(), x) != vb.end()) both.push_back(x);
      }
      r[k] = both;
    } else if (k == "const") {
      return json(false);
    } else if (k == "minimum" || k == "exclusiveMinimum" || k == "maximum" ||
               k == "exclusiveMaximum") {
      auto da = number(va), db = number(vb);
      if (!da || !db) return SchemaError(k, kp, "must be a number");
      const int c = Decimal::Compare(*da, *db);
      const bool lower = k.find("inimum") != std::string::npos;
      if ((lower && c < 0) || (!lower && c > 0)) r[k] = vb;
    } else if ((k.starts_with("min") || k.starts_with("max")) &&
               (!va.is_number() || !vb.is_number())) {
      return SchemaError(k, kp, "must be a number");
    } else if (k == "minLength" || k == "minItems" || k == "minProperties" || k == "minContains") {
      r[k] = std::max(va.get<double>(), vb.get<double>());
      if (va.is_number_integer() && vb.is_number_integer()) {
        r[k] = std::max(va.get<int64_t>(), vb.get<int64_t>());
      }
    } else if (k == "maxLength" || k == "maxItems" || k == "maxProperties" || k == "maxContains") {
      r[k] = std::min(va.get<double>(), vb.get<double>());
      if (va.is_number_integer() && vb.is_number_integer()) {
        r[k] = std::min(va.get<int64_t>(), vb.get<int64_t>());
      }
    } else if (k == "uniqueItems") {
      r[k] = va == json(true) || vb == json(true);
    } else if (k == "format" && !IsCheckedFormat(va)) {
      r[k] = vb;
    } else if (k == "format" && !IsCheckedFormat(vb)) {
      continue;
    } else if (k == "additionalProperties" || k == "items" || k == "additionalItems" ||
               k == "propertyNames" || k == "contains" || k == "unevaluatedProperties") {
      absl::StatusOr<json> m = Merge(va, vb, kp, depth + 1);
      if (!m.ok()) return m.status();
      if (k == "contains" && !IsTrivial(*m)) {
        return SchemaError(k, kp, "two contains do not merge (allOf)");
      }
      r[k] = *m;
    } else if (k == "properties") {
      json props = va;
      for (auto p = vb.begin(); p != vb.end(); ++p) {
        if (!props.contains(p.key())) {
          props[p.key()] = p.value();
          continue;
        }
        absl::StatusOr<json> m = Merge(props[p.key()], p.value(), Child(kp, p.key()), depth + 1);
        if (!m.ok()) return m.status();
        props[p.key()] = *m;
      }
      r[k] = props;
    } else if (k == "dependentRequired") {
      json d = va;
      for (auto p = vb.begin(); p != vb.end(); ++p) {
        if (!d.contains(p.key())) {
          d[p.key()] = p.value();
          continue;
        }
        for (const json& x : p.value()) d[p.key()].push_back(x);
      }
      r[k] = d;
    } else if (k == "not" && va.is_object() && vb.is_object() && va.size() == 1 && vb.size() == 1 &&
               va.contains("type") && vb.contains("type")) {
      // not A and not B = not (A or B): the types together.
      absl::StatusOr<uint32_t> ta = TypeMask(va["type"]), tb = TypeMask(vb["type"]);
      if (!ta.ok() || !tb.ok()) return SchemaError(k, kp, "bad types");
      const json t = TypeJson(*ta | *tb);
      if (t.is_null()) return SchemaError(k, kp, "the types do not join in type names");
      r[k] = json{{"type", t}};
    } else if (k == "anyOf" || k == "oneOf") {
      // (A1|A2) and (B1|B2) = (A1 and (B1|B2)) | (A2 and (B1|B2)): each branch of one list
      // carries the other list, distributed again when the branch is compiled.
      json inner = json::object();
      inner[k] = vb;
      json branches = json::array();
      for (const json& x : va) {
        json br = json::object();
        br["allOf"] = json::array({x, inner});
        branches.push_back(br);
      }
      if (k == "oneOf") {
        return SchemaError(k, kp, "two oneOf lists do not merge (allOf)");
      }
      r[k] = branches;
    } else {
      return SchemaError(k, kp, "differing values do not merge (allOf / $ref with siblings)");
    }
  }
  return r;
}

// ---- disjointness ----

uint32_t SchemaSet::PossibleTypes(const json& s, int depth) const {
  if (s.is_boolean()) return s.get<bool>() ? uint32_t{kAllTypes} : 0u;
  if (!s.is_object() || depth > 16) return kAllTypes;
  if (IsBareRef(s)) {
    if (!s["$ref"].is_string()) return kAllTypes;
    absl::StatusOr<ResolvedRef> r = Resolve(s["$ref"].get<std::string>(), "");
    return r.ok() ? PossibleTypes(*r->schema, depth + 1) : kAllTypes;
  }
  uint32_t t = kAllTypes;
  if (s.contains("type")) {
    absl::StatusOr<uint32_t> m = TypeMask(s["type"]);
    if (m.ok()) t = *m;
  }
  if (s.contains("const")) t &= JsonTypeOf(s["const"]);
  if (s.contains("enum") && s["enum"].is_array()) {
    uint32_t e = 0;
    for (const json& v : s["enum"]) e |= JsonTypeOf(v);
    t &= e;
  }
  for (const char* kw : {"anyOf", "oneOf"}) {
    if (!s.contains(kw) || !s[kw].is_array()) continue;
    uint32_t u = 0;
    for (const json& b : s[kw]) u |= PossibleTypes(b, depth + 1);
    t &= u;
  }
  if (s.contains("allOf") && s["allOf"].is_array()) {
    for (const json& b : s["allOf"]) t &= PossibleTypes(b, depth + 1);
  }
  if (s.contains("$ref") && s["$ref"].is_string()) {
    absl::StatusOr<ResolvedRef> r = Resolve(s["$ref"].get<std::string>(), "");
    if (r.ok()) t &= PossibleTypes(*r->schema, depth + 1);
  }
  if (s.contains("not") && s["not"].is_object() && s["not"].size() == 1 &&
      s["not"].contains("type")) {
    absl::StatusOr<uint32_t> m = TypeMask(s["not"]["type"]);
    if (m.ok()) t &= ~*m;
  }
  return t;
}

bool SchemaSet::Disjoint(const json& a, const json& b) const { return DisjointAt(a, b, 0); }

bool SchemaSet::DisjointAt(const json& a0, const json& b0, int depth) const {
  if (depth > 8) return false;
  // Both sides with references followed and allOf merged (as written when that fails).
  const auto flat = [this, depth](const json& s) -> json {
    absl::StatusOr<json> n = Inline(s, "", depth);
    return n.ok() ? *std::move(n) : s;
  };
  const json a = flat(a0);
  const json b = flat(b0);
  const uint32_t common = PossibleTypes(a, 0) & PossibleTypes(b, 0);
  if (common == 0) return true;
  if (!a.is_object() || !b.is_object()) return false;
  // Finite value sets with nothing in common.
  const auto values = [](const json& s) -> std::optional<json> {
    if (s.contains("const")) return json::array({s["const"]});
    if (s.contains("enum") && s["enum"].is_array()) return s["enum"];
    return std::nullopt;
  };
  const std::optional<json> va = values(a), vb = values(b);
  if (va && vb) {
    bool shared = false;
    for (const json& x : *va) shared |= std::find(vb->begin(), vb->end(), x) != vb->end();
    if (!shared) return true;
  }
  // A finite value set none of whose values the other side takes.
  for (const auto& [x, y] : {std::pair<const json*, const json*>{&a, &b}, {&b, &a}}) {
    const std::optional<json> vals = values(*x);
    if (!vals) continue;
    bool any = false;
    for (const json& v : *vals) {
      absl::StatusOr<bool> ok = ValueSatisfies(v, *y, "", /*skip_enum=*/false);
      if (!ok.ok() || *ok) {
        any = true;
        break;
      }
    }
    if (!any) return true;
  }
  // Strings of lengths that do not meet.
  if (common == kString) {
    const auto len = [](const json& s, const char* k, int64_t dflt) {
      return s.contains(k) && s[k].is_number() ? int64_t(s[k].get<double>()) : dflt;
    };
    const int64_t a_lo = len(a, "minLength", 0), a_hi = len(a, "maxLength", INT64_MAX);
    const int64_t b_lo = len(b, "minLength", 0), b_hi = len(b, "maxLength", INT64_MAX);
    if (a_hi < b_lo || b_hi < a_lo) return true;
  }
  if (common != kObject) return false;
  if (a.contains("anyOf") || a.contains("oneOf") || b.contains("anyOf") || b.contains("oneOf")) {
    return false;
  }
  // A key one side requires whose value the two sides' schemas cannot share.
  const auto prop_schema = [](const json& s, const std::string& k) -> json {
    if (s.contains("properties") && s["properties"].is_object() && s["properties"].contains(k)) {
      return s["properties"][k];
    }
    if (s.contains("patternProperties")) return json(true);
    if (s.contains("additionalProperties")) return s["additionalProperties"];
    return json(true);
  };
  for (const json* x : {&a, &b}) {
    if (!x->contains("required") || !(*x)["required"].is_array()) continue;
    for (const json& k : (*x)["required"]) {
      if (!k.is_string()) continue;
      if (DisjointAt(prop_schema(a, k.get<std::string>()), prop_schema(b, k.get<std::string>()),
                     depth + 1)) {
        return true;
      }
    }
  }
  return false;
}

// ---- values ----

absl::StatusOr<bool> SchemaSet::ValueSatisfies(const json& value, const json& s,
                                               const std::string& ptr, bool skip_enum) const {
  return Satisfies(value, s, ptr, skip_enum, 0);
}

absl::StatusOr<bool> SchemaSet::Satisfies(const json& v, const json& s0, const std::string& ptr,
                                          bool skip_enum, int depth) const {
  if (absl::Status e = Expired(); !e.ok()) return e;
  if (depth > 32) {
    return absl::ResourceExhaustedError("checking an enum value goes too deep (max_depth)");
  }
  if (s0.is_boolean()) return s0.get<bool>();
  if (!s0.is_object()) return SchemaError("schema", ptr, "not a schema");
  absl::StatusOr<json> n = Inline(s0, ptr, depth + 1);
  if (!n.ok()) return n.status();
  if (n->is_boolean()) return n->get<bool>();
  const json& s = *n;
  const uint32_t type = JsonTypeOf(v);
  std::optional<Decimal> num;
  if (type & (kInteger | kFraction)) num = Decimal::FromJson(v);
  const auto sub = [&](const json& schema, const json& value, std::string_view kw) {
    return Satisfies(value, schema, Child(ptr, kw), false, depth + 1);
  };
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& k = it.key();
    const json& x = it.value();
    if (!IsAssertion(k)) continue;
    const std::string kp = Child(ptr, k);
    if (k == "type") {
      absl::StatusOr<uint32_t> m = TypeMask(x);
      if (!m.ok()) return SchemaError(k, kp, m.status().message());
      if (!(*m & type)) return false;
    } else if (k == "enum" || k == "const") {
      if (skip_enum) continue;
      if (k == "const" && x != v) return false;
      if (k == "enum" && std::find(x.begin(), x.end(), v) == x.end()) return false;
    } else if (k == "minLength" || k == "maxLength") {
      if (!v.is_string()) continue;
      const int64_t len = CodePointCount(v.get_ref<const std::string&>());
      if (!x.is_number()) return SchemaError(k, kp, "not a number");
      if (k == "minLength" ? len < x.get<double>() : len > x.get<double>()) return false;
    } else if (k == "minimum" || k == "maximum" || k == "exclusiveMinimum" ||
               k == "exclusiveMaximum") {
      if (!num) continue;
      std::optional<Decimal> bound = Decimal::FromJson(x);
      if (!bound) return SchemaError(k, kp, "not a number");
      const int c = Decimal::Compare(*num, *bound);
      if (k == "minimum" && c < 0) return false;
      if (k == "maximum" && c > 0) return false;
      if (k == "exclusiveMinimum" && c <= 0) return false;
      if (k == "exclusiveMaximum" && c >= 0) return false;
    } else if (k == "multipleOf") {
      if (!num) continue;
      std::optional<Decimal> m = Decimal::FromJson(x);
      if (!m || !m->IsInteger() || m->int_digits.size() > 9 || !num->IsInteger()) {
        return SchemaError(k, kp, "checks only integers against integers");
      }
      const int64_t mod = std::stoll(m->int_digits);
      int64_t r = 0;
      for (char c : num->int_digits) r = (r * 10 + (c - '0')) % mod;
      if (r != 0) return false;
    } else if (k == "minItems" || k == "maxItems" || k == "minProperties" || k == "maxProperties") {
      const bool items = k.find("Items") != std::string::npos;
      if (items ? !v.is_array() : !v.is_object()) continue;
      if (!x.is_number()) return SchemaError(k, kp, "not a number");
      const double size = double(v.size());
      if (k[1] == 'i' ? size < x.get<double>() : size > x.get<double>()) return false;
    } else if (k == "uniqueItems") {
      if (!v.is_array() || x != json(true)) continue;
      for (size_t i = 0; i < v.size(); ++i) {
        for (size_t j = i + 1; j < v.size(); ++j) {
          if (v[i] == v[j]) return false;
        }
      }
    } else if (k == "required") {
      if (!v.is_object()) continue;
      for (const json& r : x) {
        if (!r.is_string() || !v.contains(r.get<std::string>())) return false;
      }
    } else if (k == "properties" || k == "additionalProperties" || k == "patternProperties") {
      if (!v.is_object()) continue;
      for (auto m = v.begin(); m != v.end(); ++m) {
        const bool listed = s.contains("properties") && s["properties"].contains(m.key());
        bool patterned = false;
        if (s.contains("patternProperties") && s["patternProperties"].is_object()) {
          for (auto p = s["patternProperties"].begin(); p != s["patternProperties"].end(); ++p) {
            absl::StatusOr<bool> hit = StringRegexMatches(p.key(), m.key());
            if (!hit.ok()) return SchemaError(k, kp, hit.status().message());
            if (!*hit) continue;
            patterned = true;
            if (k == "patternProperties") {
              absl::StatusOr<bool> ok = sub(p.value(), m.value(), k);
              if (!ok.ok() || !*ok) return ok;
            }
          }
        }
        if (k == "properties" && listed) {
          absl::StatusOr<bool> ok = sub(s["properties"][m.key()], m.value(), k);
          if (!ok.ok() || !*ok) return ok;
        } else if (k == "additionalProperties" && !listed && !patterned) {
          absl::StatusOr<bool> ok = sub(x, m.value(), k);
          if (!ok.ok() || !*ok) return ok;
        }
      }
    } else if (k == "propertyNames") {
      if (!v.is_object()) continue;
      for (auto m = v.begin(); m != v.end(); ++m) {
        absl::StatusOr<bool> ok = sub(x, json(m.key()), k);
        if (!ok.ok() || !*ok) return ok;
      }
    } else if (k == "dependentRequired" || k == "dependencies" || k == "dependentSchemas") {
      if (!v.is_object() || !x.is_object()) continue;
      for (auto d = x.begin(); d != x.end(); ++d) {
        if (!v.contains(d.key())) continue;
        if (d.value().is_array()) {
          for (const json& r : d.value()) {
            if (!r.is_string() || !v.contains(r.get<std::string>())) return false;
          }
        } else {
          absl::StatusOr<bool> ok = sub(d.value(), v, k);
          if (!ok.ok() || !*ok) return ok;
        }
      }
    } else if (k == "contains") {
      if (!v.is_array()) continue;
      int64_t n = 0;
      for (const json& e : v) {
        absl::StatusOr<bool> ok = sub(x, e, k);
        if (!ok.ok()) return ok.status();
        n += *ok;
      }
      const int64_t lo = s.contains("minContains") && s["minContains"].is_number()
                             ? s["minContains"].get<int64_t>()
                             : 1;
      if (n < lo) return false;
      if (s.contains("maxContains") && s["maxContains"].is_number() &&
          n > s["maxContains"].get<int64_t>()) {
        return false;
      }
    } else if (k == "if") {
      absl::StatusOr<bool> c = sub(x, v, k);
      if (!c.ok()) return c.status();
      const char* branch = *c ? "then" : "else";
      if (s.contains(branch)) {
        absl::StatusOr<bool> ok = sub(s[branch], v, branch);
        if (!ok.ok() || !*ok) return ok;
      }
    } else if (k == "items" || k == "prefixItems" || k == "additionalItems") {
      if (!v.is_array()) continue;
      const bool tuple =
          s.contains("prefixItems") || (s.contains("items") && s["items"].is_array());
      const json& prefix = s.contains("prefixItems") ? s["prefixItems"]
                           : tuple                   ? s["items"]
                                                     : json::array();
      const json rest = s.contains("prefixItems") ? s.value("items", json(true))
                        : tuple                   ? s.value("additionalItems", json(true))
                                                  : s.value("items", json(true));
      if (k != "items" && !(k == "prefixItems" || (k == "additionalItems" && !tuple))) continue;
      for (size_t i = 0; i < v.size(); ++i) {
        absl::StatusOr<bool> ok = sub(i < prefix.size() ? prefix[i] : rest, v[i], k);
        if (!ok.ok() || !*ok) return ok;
      }
    } else if (k == "anyOf" || k == "oneOf" || k == "allOf") {
      int matched = 0;
      for (const json& b : x) {
        absl::StatusOr<bool> ok = sub(b, v, k);
        if (!ok.ok()) return ok.status();
        matched += *ok;
      }
      if (k == "anyOf" && matched == 0) return false;
      if (k == "oneOf" && matched != 1) return false;
      if (k == "allOf" && matched != int(x.size())) return false;
    } else if (k == "not") {
      absl::StatusOr<bool> ok = sub(x, v, k);
      if (!ok.ok()) return ok.status();
      if (*ok) return false;
    } else if (k == "format") {
      if (!v.is_string() || !IsCheckedFormat(x)) continue;
      GrammarBuilder b;
      JsonText t(b, false);
      std::optional<GrammarBuilder::Expr> body = t.FormatBody(x.get<std::string>());
      if (!body) return SchemaError(k, kp, "this format is not supported");
      const RuleId root = b.DeclareRule("root");
      b.DefineRule(root, *body);
      absl::StatusOr<Grammar> g = std::move(b).Build(root);
      if (!g.ok()) return g.status();
      if (!Matches(*g, v.get_ref<const std::string&>())) return false;
    } else if (k == "pattern") {
      if (!v.is_string()) continue;
      if (!x.is_string()) return SchemaError(k, kp, "not a string");
      absl::StatusOr<bool> m = StringRegexMatches(x.get<std::string>(), v.get<std::string>());
      if (!m.ok()) return SchemaError(k, kp, m.status().message());
      if (!*m) return false;
    } else if (k == "then" || k == "else" || k == "maxContains" || k == "minContains") {
      continue;
    } else {
      return SchemaError(k, kp, "cannot be checked against an enum's values");
    }
  }
  return true;
}

}  // namespace heavykv::grammar
