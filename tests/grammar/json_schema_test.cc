// JSON Schema -> grammar (engine/grammar/json_schema.h): hand-written cases, then every group of
// JSON-Schema-Test-Suite (tests/data/json_schema_test_suite) with instances written as Python's
// json.dumps writes them. A schema may fail to compile (counted and printed as coverage); a
// compiled one must never accept an invalid instance.
#include "engine/grammar/json_schema.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <regex>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/grammar/json_schema_set.h"
#include "engine/grammar/json_text.h"

namespace heavykv::grammar {
namespace {

using json = nlohmann::ordered_json;

absl::StatusOr<Grammar> CompileSchema(std::string_view schema, JsonSchemaOptions options = {}) {
  GrammarBuilder b;
  absl::StatusOr<GrammarBuilder::Expr> e = CompileJsonSchema(b, schema, options);
  if (!e.ok()) return e.status();
  const RuleId root = b.DeclareRule("root");
  b.DefineRule(root, *e);
  return std::move(b).Build(root);
}

Grammar MustCompile(std::string_view schema, JsonSchemaOptions options = {}) {
  absl::StatusOr<Grammar> g = CompileSchema(schema, options);
  EXPECT_TRUE(g.ok()) << schema << ": " << g.status();
  return g.ok() ? *std::move(g) : Grammar{};
}

TEST(PythonJsonDumpsTest, WritesLikePython) {
  EXPECT_EQ(PythonJsonDumps(json::parse(R"({"a": [1, 2.5, null, true], "b": {"c": "x"}})")),
            R"({"a": [1, 2.5, null, true], "b": {"c": "x"}})");
  EXPECT_EQ(PythonJsonDumps(json(1.0)), "1.0");
  EXPECT_EQ(PythonJsonDumps(json(-0.0)), "-0.0");
  EXPECT_EQ(PythonJsonDumps(json(1e100)), "1e+100");
  EXPECT_EQ(PythonJsonDumps(json(1.5e-7)), "1.5e-07");
  EXPECT_EQ(PythonJsonDumps(json(1e16)), "1e+16");
  EXPECT_EQ(PythonJsonDumps(json(123456789012345.6)), "123456789012345.6");
  EXPECT_EQ(PythonJsonDumps(json(0.0001)), "0.0001");
  EXPECT_EQ(PythonJsonDumps(json(0.00001)), "1e-05");
  EXPECT_EQ(PythonJsonDumps(json("é\"\\\n\x01")), "\"é\\\"\\\\\\n\\u0001\"");
}

TEST(JsonSchemaTest, AnyJsonAndTypes) {
  Grammar any = MustCompile("{}");
  for (const char* ok : {"null", "1", "-0.5e+3", R"("a\u00e9")", "[1, [], {}]",
                         R"({"a": {"b": [true, false]}})", "{ }", "[\n  1,\n  2\n]"}) {
    EXPECT_TRUE(Matches(any, ok)) << ok;
  }
  for (const char* bad : {"", "nul", "01", "1.", "[1,]", R"({"a"})", "{'a': 1}", "[1  ]"}) {
    EXPECT_FALSE(Matches(any, bad)) << bad;
  }
  Grammar t = MustCompile(R"({"type": ["integer", "null"]})");
  EXPECT_TRUE(Matches(t, "12"));
  EXPECT_TRUE(Matches(t, "12.0"));
  EXPECT_TRUE(Matches(t, "null"));
  EXPECT_FALSE(Matches(t, "12.5"));
  EXPECT_FALSE(Matches(t, "\"12\""));
  EXPECT_FALSE(Matches(MustCompile("false"), "null"));
}

TEST(JsonSchemaTest, ObjectsTakeKeysInAnyOrderOnce) {
  Grammar g = MustCompile(R"({"type": "object", "properties": {"a": {"type": "integer"},
      "b": {"type": "string"}, "c": {"type": "boolean"}}, "required": ["a", "b"],
      "additionalProperties": false})");
  EXPECT_TRUE(Matches(g, R"({"a": 1, "b": "x"})"));
  EXPECT_TRUE(Matches(g, R"({"b": "x", "c": true, "a": 1})"));
  EXPECT_TRUE(Matches(g, R"({"b":"x","a":1})"));
  EXPECT_FALSE(Matches(g, R"({"a": 1})"));
  EXPECT_FALSE(Matches(g, R"({"a": 1, "b": "x", "a": 2})"));
  EXPECT_FALSE(Matches(g, R"({"a": 1, "b": "x", "d": 2})"));
  EXPECT_FALSE(Matches(g, R"({"a": "1", "b": "x"})"));
  Grammar open = MustCompile(R"({"properties": {"a": {"type": "integer"}}})");
  EXPECT_TRUE(Matches(open, R"({"b": "x", "a": 1, "ab": [1]})"));
  EXPECT_FALSE(Matches(open, R"({"b": "x", "a": "1"})"));
  EXPECT_FALSE(Matches(open, R"({"\u0061": "1"})"));  // "a" written with an escape
}

TEST(JsonSchemaTest, ManyPropertiesTakeAnyOrderAndTrackTheRequiredOnes) {
  std::string props;
  for (int i = 0; i < 12; ++i) {
    absl::StrAppend(&props, i ? ", " : "", "\"k", i, "\": {\"type\": \"integer\"}");
  }
  Grammar g = MustCompile(absl::StrCat(R"({"type": "object", "properties": {)", props,
                                       R"(}, "required": ["k3", "k9"]})"));
  EXPECT_TRUE(Matches(g, R"({"k3": 1, "k9": 2})"));
  EXPECT_TRUE(Matches(g, R"({"k11": 0, "k9": 2, "x": "y", "k0": 5, "k3": 1})"));
  EXPECT_FALSE(Matches(g, R"({"k11": 0, "k9": 2, "k0": 5})"));
  EXPECT_FALSE(Matches(g, R"({"k3": 1, "k9": 2, "k5": "5"})"));
  EXPECT_FALSE(Matches(g, R"({"k3": 1, "k9": 2, "k3": "1"})"));
}

TEST(JsonSchemaTest, PatternKeysBesideListedOnes) {
  Grammar g = MustCompile(R"({"type": "object", "properties": {"x-id": {"type": "integer"}},
      "patternProperties": {"^x-": {"type": ["integer", "string"]}},
      "additionalProperties": false, "dependencies": {}})");
  EXPECT_TRUE(Matches(g, R"({"x-id": 1, "x-name": 2})"));
  EXPECT_FALSE(Matches(g, R"({"x-id": "1"})"));  // the listed key's schema holds either way
  EXPECT_FALSE(Matches(g, R"({"y": 1})"));
  Grammar d = MustCompile(R"({"properties": {"a": {}, "b": {}},
      "dependencies": {"a": {"required": ["b"]}}})");
  EXPECT_TRUE(Matches(d, R"({"a": 1, "b": 2})"));
  EXPECT_TRUE(Matches(d, R"({"b": 2})"));
  EXPECT_FALSE(Matches(d, R"({"a": 1})"));
}

TEST(JsonSchemaTest, PropertyNamesShapeTheKeys) {
  Grammar g = MustCompile(R"({"type": "object", "propertyNames": {"pattern": "^[a-z]+$",
      "maxLength": 3}, "additionalProperties": {"type": "integer"}})");
  EXPECT_TRUE(Matches(g, R"({"ab": 1, "xyz": 2})"));
  EXPECT_FALSE(Matches(g, R"({"abcd": 1})"));
  EXPECT_FALSE(Matches(g, R"({"A": 1})"));
  EXPECT_FALSE(Matches(g, R"({"ab": "1"})"));
}

TEST(JsonSchemaTest, IntegerAndNumberBoundsAreExact) {
  Grammar g = MustCompile(R"({"type": "integer", "minimum": -15, "exclusiveMaximum": 120})");
  for (int v = -40; v <= 200; ++v) {
    EXPECT_EQ(Matches(g, std::to_string(v)), v >= -15 && v < 120) << v;
  }
  EXPECT_TRUE(Matches(g, "-0"));
  EXPECT_TRUE(Matches(g, "7.0"));
  Grammar n = MustCompile(R"({"type": "number", "minimum": 0.25, "maximum": 10.5})");
  for (const char* ok : {"0.25", "0.250", "0.3", "1", "10", "10.5", "10.49", "3.14159"}) {
    EXPECT_TRUE(Matches(n, ok)) << ok;
  }
  for (const char* bad : {"0.2", "0.249", "0", "-1", "10.51", "11", "100"}) {
    EXPECT_FALSE(Matches(n, bad)) << bad;
  }
  Grammar x = MustCompile(R"({"type": "number", "exclusiveMinimum": 0})");
  EXPECT_TRUE(Matches(x, "0.001"));
  EXPECT_FALSE(Matches(x, "0"));
  EXPECT_FALSE(Matches(x, "0.000"));
  EXPECT_FALSE(Matches(x, "-0.5"));
  Grammar m = MustCompile(R"({"type": "integer", "multipleOf": 7})");
  for (int v = -30; v <= 30; ++v) EXPECT_EQ(Matches(m, std::to_string(v)), v % 7 == 0) << v;
}

// Random bounds against random numbers: the grammar agrees with exact decimal comparison.
TEST(JsonSchemaTest, NumberRangesAgreeWithDecimalComparison) {
  std::mt19937 rng(43);
  const auto number = [&rng](bool integer) {
    std::string t = rng() % 3 == 0 ? "-" : "";
    const int int_len = 1 + rng() % 3;
    for (int i = 0; i < int_len; ++i)
      t += char('0' + (i == 0 && int_len > 1 ? 1 + rng() % 9 : rng() % 10));
    if (!integer && rng() % 2) {
      t += '.';
      const int frac_len = 1 + rng() % 3;
      for (int i = 0; i < frac_len; ++i) t += char('0' + rng() % 10);
    }
    return t;
  };
  for (int round = 0; round < 60; ++round) {
    const bool integer = round % 2 == 0;
    const std::string lo = number(false), hi = number(false);
    const bool lo_ex = rng() % 2, hi_ex = rng() % 2;
    const std::string schema =
        absl::StrCat(R"({"type": ")", integer ? "integer" : "number", R"(", ")",
                     lo_ex ? "exclusiveMinimum" : "minimum", R"(": )", lo, R"(, ")",
                     hi_ex ? "exclusiveMaximum" : "maximum", R"(": )", hi, "}");
    Grammar g = MustCompile(schema);
    const Decimal dlo = *Decimal::Parse(lo), dhi = *Decimal::Parse(hi);
    for (int k = 0; k < 80; ++k) {
      const std::string x = number(integer && k % 4 != 0);
      const Decimal dx = *Decimal::Parse(x);
      const int clo = Decimal::Compare(dx, dlo), chi = Decimal::Compare(dx, dhi);
      bool valid = (lo_ex ? clo > 0 : clo >= 0) && (hi_ex ? chi < 0 : chi <= 0);
      // Integers as integers or with one zero ("3.0", as Python writes an integral float).
      if (integer)
        valid = valid && dx.IsInteger() &&
                (x.find('.') == std::string::npos || x.substr(x.find('.')) == ".0");
      EXPECT_EQ(Matches(g, x), valid) << schema << " on " << x;
    }
  }
}

TEST(JsonSchemaTest, ConstAndEnumMatchNumbersByValue) {
  Grammar g = MustCompile(R"({"enum": [1, "a\"b", [2, {"x": null}], {"p": 1, "q": 2}]})");
  EXPECT_TRUE(Matches(g, "1"));
  EXPECT_TRUE(Matches(g, "1.0"));
  EXPECT_FALSE(Matches(g, "true"));
  EXPECT_TRUE(Matches(g, R"("a\"b")"));
  EXPECT_TRUE(Matches(g, R"([2.0, {"x": null}])"));
  EXPECT_TRUE(Matches(g, R"({"q": 2, "p": 1})"));
  EXPECT_FALSE(Matches(g, R"({"q": 2})"));
  Grammar f = MustCompile(R"({"type": "string", "enum": ["a", 1, "bc"], "maxLength": 1})");
  EXPECT_TRUE(Matches(f, R"("a")"));
  EXPECT_FALSE(Matches(f, R"("bc")"));
  EXPECT_FALSE(Matches(f, "1"));
}

TEST(JsonSchemaTest, ReferencesRecurse) {
  Grammar g = MustCompile(R"({"$defs": {"node": {"type": "object", "properties": {
      "v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
      "required": ["v"], "additionalProperties": false}}, "$ref": "#/$defs/node"})");
  EXPECT_TRUE(Matches(g, R"({"v": 1, "next": {"v": 2, "next": null}})"));
  EXPECT_FALSE(Matches(g, R"({"v": 1, "next": {"next": null}})"));
}

TEST(JsonSchemaTest, AllOfMergesAndOneOfNeedsDisjointBranches) {
  Grammar g = MustCompile(R"({"allOf": [{"type": "object", "properties": {"a": {"type":
      "integer"}}, "required": ["a"]}, {"properties": {"a": {"minimum": 3}, "b": {"type":
      "string"}}}]})");
  EXPECT_TRUE(Matches(g, R"({"a": 3, "b": "x"})"));
  EXPECT_FALSE(Matches(g, R"({"a": 2})"));
  EXPECT_FALSE(Matches(g, R"({"a": 3, "b": 1})"));
  Grammar one = MustCompile(R"({"oneOf": [{"type": "string"}, {"type": "integer"}]})");
  EXPECT_TRUE(Matches(one, "1"));
  EXPECT_TRUE(Matches(one, R"("1")"));
  absl::StatusOr<Grammar> overlap = CompileSchema(R"({"oneOf": [{"type": "number"},
      {"type": "integer"}]})");
  EXPECT_EQ(overlap.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(JsonSchemaTest, KeyConditionsCompileOnTheKeysPresent) {
  Grammar g = MustCompile(R"({"type": "object", "properties": {"r": {"type": "number"},
      "l": {"type": "number"}, "w": {"type": "number"}}, "additionalProperties": false,
      "oneOf": [{"required": ["r"]}, {"required": ["l", "w"]}], "not": {"required": ["w", "r"]}})");
  EXPECT_TRUE(Matches(g, R"({"r": 1})"));
  EXPECT_TRUE(Matches(g, R"({"w": 2, "l": 1})"));
  EXPECT_FALSE(Matches(g, R"({"l": 1})"));
  EXPECT_FALSE(Matches(g, R"({"r": 1, "l": 1, "w": 2})"));  // both branches
  EXPECT_FALSE(Matches(g, R"({"r": 1, "w": 2})"));          // the not
  EXPECT_FALSE(Matches(g, "{}"));
  EXPECT_FALSE(Matches(g, "1"));
}

TEST(JsonSchemaTest, OneOfObjectsToldApartByRequiredKeys) {
  Grammar g = MustCompile(R"({"type": "object", "oneOf": [
      {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
      {"properties": {"b": {"type": "string"}}, "required": ["b"]}]})");
  EXPECT_TRUE(Matches(g, R"({"a": 1})"));
  EXPECT_TRUE(Matches(g, R"({"b": "x", "c": null})"));
  EXPECT_FALSE(Matches(g, R"({"a": 1, "b": "x"})"));  // both branches match
  EXPECT_FALSE(Matches(g, R"({"c": 1})"));
  EXPECT_FALSE(Matches(g, R"({"a": "1"})"));
}

TEST(JsonSchemaTest, ErrorsNameTheKeywordAndItsPointer) {
  absl::StatusOr<Grammar> g = CompileSchema(R"({"properties": {"a/b": {"if": {}}}})");
  ASSERT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("`if`"), std::string::npos) << g.status();
  auto param = g.status().GetPayload(kSchemaParamPayload);
  ASSERT_TRUE(param.has_value());
  EXPECT_EQ(std::string(*param), "/properties/a~1b/if");
  EXPECT_EQ(CompileSchema(R"({"$ref": "http://example.com/s.json"})").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CompileSchema("{").status().code(), absl::StatusCode::kInvalidArgument);
  GrammarLimits tight;
  tight.max_depth = 3;
  GrammarBuilder b(tight);
  absl::StatusOr<GrammarBuilder::Expr> deep =
      CompileJsonSchema(b, R"({"items": {"items": {"items": {"items": {"items": {}}}}}})", {});
  EXPECT_EQ(deep.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(JsonSchemaTest, FormatsAndStringLengths) {
  Grammar d = MustCompile(R"({"type": "string", "format": "date-time"})");
  EXPECT_TRUE(Matches(d, R"("2024-02-29T12:30:00Z")"));
  EXPECT_TRUE(Matches(d, R"("1999-12-31T23:59:59.123+05:30")"));
  EXPECT_FALSE(Matches(d, R"("2023-02-29T12:30:00Z")"));
  EXPECT_FALSE(Matches(d, R"("2024-04-31T12:30:00Z")"));
  EXPECT_FALSE(Matches(d, R"("2024-01-01 12:30:00Z")"));
  Grammar e = MustCompile(R"({"type": "string", "format": "email", "maxLength": 254})");
  EXPECT_TRUE(Matches(e, R"("john.doe@example.com")"));
  EXPECT_FALSE(Matches(e, R"("john..doe@example.com")"));
  Grammar u = MustCompile(R"({"type": "string", "format": "uri", "maxLength": 25})");
  EXPECT_TRUE(Matches(u, R"("https://example.com/a?b#c")"));
  EXPECT_FALSE(Matches(u, R"("https://example.com/abcdefgh")"));
  EXPECT_FALSE(Matches(u, R"("example.com")"));
  Grammar l = MustCompile(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_TRUE(Matches(l, R"("ab")"));
  EXPECT_TRUE(Matches(l, R"("\n\u00e9x")"));
  EXPECT_TRUE(Matches(l, "\"\xC3\xA9\xC3\xA9\""));
  EXPECT_FALSE(Matches(l, R"("a")"));
  EXPECT_FALSE(Matches(l, R"("abcd")"));
  Grammar big = MustCompile(R"({"type": "string", "minLength": 700, "maxLength": 5000})");
  for (int n : {699, 700, 701, 1000, 4999, 5000, 5001}) {
    EXPECT_EQ(Matches(big, "\"" + std::string(n, 'x') + "\""), n >= 700 && n <= 5000) << n;
  }
}

TEST(JsonSchemaTest, PatternsMatchTheDecodedString) {
  Grammar g = MustCompile(R"({"type": "string", "pattern": "^[a-z\"]+-\\d{2}$"})");
  EXPECT_TRUE(Matches(g, R"("ab-12")"));
  EXPECT_TRUE(Matches(g, R"("a\"b-12")"));  // the string a"b-12
  EXPECT_FALSE(Matches(g, R"("a"b-12")"));
  EXPECT_FALSE(Matches(g, R"("ab-1")"));
  EXPECT_FALSE(Matches(g, R"("Ab-12")"));
  Grammar search = MustCompile(R"({"type": "string", "pattern": "[0-9]{3}"})");
  EXPECT_TRUE(Matches(search, R"("ab123cd")"));
  EXPECT_FALSE(Matches(search, R"("ab12cd")"));
  Grammar both = MustCompile(R"({"type": "string", "pattern": "^[a-z]+:[0-9]+$",
      "minLength": 4, "maxLength": 6})");
  EXPECT_TRUE(Matches(both, R"("ab:12")"));
  EXPECT_TRUE(Matches(both, R"("a:12")"));
  EXPECT_FALSE(Matches(both, R"("a:1")"));
  EXPECT_FALSE(Matches(both, R"("abcd:12")"));
  Grammar within = MustCompile(R"({"type": "string", "pattern": "[0-9]{3}", "maxLength": 4})");
  EXPECT_TRUE(Matches(within, R"("a123")"));
  EXPECT_FALSE(Matches(within, R"("a1234")"));
  for (const char* bad : {"(?=a)", R"(\\1)", R"(\\bx)", "a{,3}", "[]"}) {
    EXPECT_EQ(CompileSchema(absl::StrCat(R"({"pattern": ")", bad, R"("})")).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

// Patterns on random strings against std::regex (ECMAScript) as a reference: a string the
// grammar takes is one the pattern finds, and over ASCII the two agree.
TEST(JsonSchemaTest, PatternsAgreeWithStdRegex) {
  const char* const kPatterns[] = {"^[a-z]+$",
                                   "a|b0",
                                   "^(ab|b)*$",
                                   "[0-9]{2,3}",
                                   "^\\d+(\\.\\d+)?$",
                                   "^[^a]*$",
                                   "\\s",
                                   "^[\\w.-]+@[\\w.-]+$",
                                   "b{2}",
                                   "^.$",
                                   "^\\W*$",
                                   "(?:a|\\\\)x",
                                   "^[\"-]+",
                                   "^$",
                                   "^a?b?$",
                                   "[^\\S]",
                                   "x*$"};
  const std::string alphabet = "ab01x-. _@\"\\\n\t";
  std::mt19937 rng(7);
  for (const char* p : kPatterns) {
    Grammar g = MustCompile(json{{"type", "string"}, {"pattern", p}}.dump());
    const std::regex re(p, std::regex::ECMAScript);
    for (int k = 0; k < 300; ++k) {
      std::string v;
      const int len = rng() % 6;
      for (int i = 0; i < len; ++i) v += alphabet[rng() % alphabet.size()];
      const bool found = std::regex_search(v, re);
      EXPECT_EQ(Matches(g, PythonJsonDumps(json(v))), found) << p << " on " << json(v).dump();
    }
  }
}

TEST(JsonSchemaTest, WhitespaceIsBounded) {
  Grammar g = MustCompile(R"({"type": "array", "items": {"type": "integer"}})");
  EXPECT_TRUE(Matches(g, "[1, 2]"));
  EXPECT_TRUE(Matches(g, "[\n    1,\n    2\n]"));
  EXPECT_FALSE(Matches(g, "[1,  2]"));
  EXPECT_FALSE(Matches(g, "[1,\n" + std::string(21, ' ') + "2]"));
  JsonSchemaOptions compact;
  compact.pretty = false;
  Grammar c = MustCompile(R"({"type": "array"})", compact);
  EXPECT_TRUE(Matches(c, "[1, 2]"));
  EXPECT_FALSE(Matches(c, "[1,\n2]"));
}

// ---- test groups: {"schema", "tests": [{"data", "valid"}]} ----

struct Tally {
  int groups = 0, compiled = 0, all_passed = 0, tests = 0, valid_rejected = 0;
  int invalid_accepted = 0;
  void Add(const Tally& o) {
    groups += o.groups;
    compiled += o.compiled;
    all_passed += o.all_passed;
    tests += o.tests;
    valid_rejected += o.valid_rejected;
    invalid_accepted += o.invalid_accepted;
  }
};

// Runs every group of the files under `dir` (a file holds one group or an array of them),
// tallied by `category(relative path)`; prints the coverage and returns the total.
Tally RunGroups(const std::filesystem::path& dir,
                const std::function<std::string(const std::string&)>& category) {
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.path().extension() == ".json") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  std::map<std::string, Tally> by_category;
  std::map<std::string, int> errors_by_keyword;
  std::vector<double> compile_ms;
  const bool verbose = std::getenv("SUITE_VERBOSE") != nullptr;
  for (const auto& path : files) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    json groups;
    try {
      groups = json::parse(text.str());
    } catch (const json::exception&) {
      continue;
    }
    if (groups.is_object()) groups = json::array({groups});
    const std::string rel = std::filesystem::relative(path, dir).string();
    Tally& t = by_category[category(rel)];
    for (const json& group : groups) {
      if (!group.is_object() || !group.contains("schema")) continue;
      ++t.groups;
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<Grammar> g = CompileSchema(group["schema"].dump());
      compile_ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
      if (verbose && compile_ms.back() > 300) {
        std::printf("[slow] %s: %.0f ms (%s)\n", rel.c_str(), compile_ms.back(),
                    g.ok() ? "compiled" : std::string(g.status().message()).substr(0, 80).c_str());
      }
      if (!g.ok()) {
        const std::string m(g.status().message());
        const size_t a = m.find('`'), z = m.find('`', a + 1);
        ++errors_by_keyword[absl::StrCat(
            absl::StatusCodeToString(g.status().code()), " ",
            a == std::string::npos ? m.substr(0, 50) : m.substr(a, z - a + 1))];
        if (verbose) std::printf("[error] %s: %s\n", rel.c_str(), m.substr(0, 300).c_str());
        continue;
      }
      ++t.compiled;
      bool all = true;
      for (const json& test : group.value("tests", json::array())) {
        ++t.tests;
        const std::string instance = PythonJsonDumps(test["data"]);
        const bool valid = test["valid"].get<bool>();
        const bool matched = Matches(*g, instance);
        if (valid && !matched) {
          ++t.valid_rejected;
          all = false;
          if (verbose) {
            std::printf("[rejected] %s: %s\n", rel.c_str(), instance.substr(0, 300).c_str());
          }
        }
        if (!valid && matched) {
          ++t.invalid_accepted;
          all = false;
          ADD_FAILURE() << rel << ": \"" << group.value("description", "") << "\" / \""
                        << test.value("description", "") << "\": the invalid instance "
                        << instance.substr(0, 2000) << " was accepted by the schema "
                        << group["schema"].dump().substr(0, 2000);
        }
      }
      t.all_passed += all;
    }
  }
  Tally sum;
  for (const auto& [name, t] : by_category) {
    std::printf(
        "[coverage] %-24s groups %5d compiled %5d all-passed %5d (%5.1f%%) tests %6d "
        "valid-rejected %5d invalid-accepted %d\n",
        name.c_str(), t.groups, t.compiled, t.all_passed,
        100.0 * t.all_passed / std::max(1, t.groups), t.tests, t.valid_rejected,
        t.invalid_accepted);
    sum.Add(t);
  }
  std::sort(compile_ms.begin(), compile_ms.end());
  std::printf(
      "[coverage] total groups %d compiled %d all-passed %d (%.1f%%) tests %d "
      "valid-rejected %d invalid-accepted %d; compile p50 %.3f ms p90 %.3f ms p99 %.3f ms "
      "max %.1f ms\n",
      sum.groups, sum.compiled, sum.all_passed, 100.0 * sum.all_passed / std::max(1, sum.groups),
      sum.tests, sum.valid_rejected, sum.invalid_accepted, compile_ms[compile_ms.size() / 2],
      compile_ms[compile_ms.size() * 9 / 10], compile_ms[compile_ms.size() * 99 / 100],
      compile_ms.back());
  std::vector<std::pair<int, std::string>> top;
  for (const auto& [k, n] : errors_by_keyword) top.push_back({n, k});
  std::sort(top.rbegin(), top.rend());
  for (size_t i = 0; i < std::min<size_t>(top.size(), 25); ++i) {
    std::printf("[coverage] not compiled: %4d x %s\n", top[i].first, top[i].second.c_str());
  }
  return sum;
}

TEST(JsonSchemaSuiteTest, NoInvalidInstanceIsAccepted) {
  const Tally t =
      RunGroups(std::filesystem::path(HEAVYKV_SOURCE_DIR) / "tests/data/json_schema_test_suite",
                [](const std::string& rel) { return rel.substr(0, rel.find('/')); });
  EXPECT_GT(t.groups, 600);
  EXPECT_EQ(t.invalid_accepted, 0);
}

// Real-world schemas: JSONSchemaBench's MaskBench data (github.com/guidance-ai/jsonschemabench,
// maskbench/data: 11,306 files of {"schema", "tests"}, not in the tree). Set
// JSON_SCHEMA_BENCH_DIR to a folder of those files; SUITE_VERBOSE=1 prints each refusal,
// rejected valid instance and slow compile.
TEST(JsonSchemaBenchTest, RealWorldCoverage) {
  const char* dir = std::getenv("JSON_SCHEMA_BENCH_DIR");
  if (dir == nullptr) GTEST_SKIP() << "JSON_SCHEMA_BENCH_DIR is not set";
  const Tally t = RunGroups(dir, [](const std::string& rel) {
    std::string c = rel.substr(0, rel.find("---"));
    if (c == rel) c = c.substr(0, c.find_last_of('_'));
    return c;
  });
  EXPECT_EQ(t.invalid_accepted, 0);
}

}  // namespace
}  // namespace heavykv::grammar
