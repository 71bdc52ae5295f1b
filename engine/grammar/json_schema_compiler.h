// The JSON Schema compiler's insides (json_schema.h is the interface), shared by
// json_schema.cc (the driver, enums, strings, numbers, arrays) and json_schema_object.cc
// (objects). Not for use elsewhere.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/grammar/json_schema.h"
#include "engine/grammar/json_schema_set.h"
#include "engine/grammar/json_text.h"
#include "nlohmann/json.hpp"

namespace heavykv::grammar::json_schema_internal {

using json = nlohmann::ordered_json;
using Expr = GrammarBuilder::Expr;

// The longest string a length bound is written out for.
constexpr int64_t kMaxLength = 1'000'000;

// Objects with at most this many named properties take them in any order, each once; larger
// ones in any order too when at most kMaxTracked keys need tracking (required ones, ...).
constexpr int kMaxAnyOrderProperties = 8;
constexpr int kMaxTracked = 8;

// Draft 3 and 4 validators take 1.0 for a number but not for an integer.
bool IsDraft4(const json& root);

// One compile of one schema document into the caller's builder. Each $ref target becomes one
// named rule (memoized by its JSON pointer), so recursion is a rule calling itself; every other
// subschema is expanded where it is used, after SchemaSet::Normalize merged its allOf / $ref
// siblings. Not thread-safe; lives for one CompileJsonSchema call.
class Compiler {
 public:
  Compiler(GrammarBuilder& b, const json& root, const JsonSchemaOptions& options)
      : b_(b),
        draft4_(IsDraft4(root)),
        t_(b, options.pretty, !draft4_),
        options_(options),
        schemas_(root) {
    schemas_.set_deadline(deadline_);
  }

  absl::StatusOr<Expr> Compile(const json& schema, const std::string& ptr, int depth);
  Expr AnyValue();

 private:
  absl::StatusOr<Expr> CompileNormalized(const json& s, const std::string& ptr, int depth);
  absl::StatusOr<Expr> CompileRef(const std::string& ref, const std::string& ptr, int depth);
  absl::StatusOr<Expr> CompileEnum(const json& s, const std::string& ptr);
  absl::StatusOr<Expr> CompileConst(const json& value, int depth, bool integer_text = false);
  absl::StatusOr<Expr> CompileString(const json& s, const std::string& ptr);
  absl::StatusOr<Expr> CompileNumber(const json& s, const std::string& ptr, bool integer_only);
  absl::StatusOr<Expr> NonIntegerNumber(const json& s, const std::string& ptr);
  absl::StatusOr<Expr> CompileArray(const json& s, const std::string& ptr, int depth);
  absl::StatusOr<Expr> CompileObject(const json& s, const std::string& ptr, int depth);
  absl::StatusOr<uint32_t> TypesOf(const json& s, const std::string& ptr);

  GrammarBuilder& b_;
  bool draft4_;
  JsonText t_;
  JsonSchemaOptions options_;
  SchemaSet schemas_;
  absl::flat_hash_map<std::string, Expr> ref_rules_;
  Expr any_value_ = -1, any_object_ = -1;
  int num_refs_ = 0;
  std::chrono::steady_clock::time_point deadline_ =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.max_compile_ms);
};

// A schema that only says which keys an object has: {required: [...]} and/or
// {not: {required: [...]}} (annotations aside). anyOf/oneOf lists of these compile as a
// condition on the set of keys present (CompileObject), not as alternatives.
bool IsPresenceOnly(const json& s);
bool AllPresenceOnly(const json& branches);
bool IsTrivialSchema(const json& s);
// allOf of `parts` without the trivial ones: a single schema stays itself (a bare $ref stays a
// reference, so recursion through it is a rule, not an expansion).
json AllOf(const std::vector<json>& parts);
// A JSON pointer one step down.
std::string Child(const std::string& ptr, std::string_view key);
std::string Child(const std::string& ptr, size_t index);

}  // namespace heavykv::grammar::json_schema_internal
