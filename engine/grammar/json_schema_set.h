// SchemaSet: a JSON Schema document and what the compiler (json_schema.cc) asks of its schemas as
// JSON: local references, normalization (allOf and $ref with siblings merged into one schema),
// whether two schemas can match the same instance, and whether a value (an enum's) validates.
//
// Every answer errs on the safe side: a merge or check that cannot be made exactly is an
// INVALID_ARGUMENT naming the keyword and its JSON pointer; Disjoint says false unless sure.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace heavykv::grammar {

// Subsets of the JSON types; an integer is a number with no fraction.
enum TypeBit : uint32_t {
  kNull = 1,
  kBoolean = 2,
  kObject = 4,
  kArray = 8,
  kString = 16,
  kInteger = 32,
  kFraction = 64,  // numbers that are not integers
  kAllTypes = 127,
};

// INVALID_ARGUMENT "JSON Schema keyword `kw` at /ptr: why", with the pointer as the "param"
// payload (the same payload key the HTTP front reads, server/http/http_status.h).
absl::Status SchemaError(absl::string_view keyword, const std::string& ptr, absl::string_view why);
inline constexpr absl::string_view kSchemaParamPayload = "type.heavykv.dev/openai.param";

// Keywords that can make an instance invalid; any other key is an annotation or unknown, which
// validators ignore.
bool IsAssertionKeyword(std::string_view keyword);
// A schema that is a $ref and nothing else that asserts (annotations beside it are fine).
bool IsBareRef(const nlohmann::ordered_json& s);
absl::StatusOr<uint32_t> TypeMask(const nlohmann::ordered_json& type);
uint32_t JsonTypeOf(const nlohmann::ordered_json& value);
absl::StatusOr<int64_t> NonNegativeInt(const nlohmann::ordered_json& v);
// Formats Python's jsonschema FormatChecker checks; any other format is an annotation there.
bool IsCheckedFormat(const nlohmann::ordered_json& format);

struct ResolvedRef {
  const nlohmann::ordered_json* schema = nullptr;
  std::string pointer;  // its JSON pointer in the document
};

class SchemaSet {
 public:
  explicit SchemaSet(const nlohmann::ordered_json& root);
  // Past it, Normalize, merges and value checks fail with RESOURCE_EXHAUSTED.
  void set_deadline(std::chrono::steady_clock::time_point t) { deadline_ = t; }

  // A local reference: "#", "#/json/pointer" (~0 ~1 and %-escapes), "#anchor", or the root's
  // own $id with one of those. Remote ones are refused.
  absl::StatusOr<ResolvedRef> Resolve(const std::string& ref, const std::string& ptr) const;
  // `s` with $ref-with-siblings and allOf merged in (no allOf left at its top), draft 4's boolean
  // exclusiveMinimum/Maximum folded, and unevaluatedProperties turned into additionalProperties
  // where no applicator is left to see.
  absl::StatusOr<nlohmann::ordered_json> Normalize(const nlohmann::ordered_json& s,
                                                   const std::string& ptr, int depth) const;
  // Normalize(allOf: [base, branch]).
  absl::StatusOr<nlohmann::ordered_json> MergeInto(const nlohmann::ordered_json& base,
                                                   const nlohmann::ordered_json& branch,
                                                   const std::string& ptr) const;
  // True only when no instance can match both.
  bool Disjoint(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b) const;
  // Whether `value` validates against `s` (enum and const skipped when `skip_enum`); an error
  // for keywords this does not check.
  absl::StatusOr<bool> ValueSatisfies(const nlohmann::ordered_json& value,
                                      const nlohmann::ordered_json& s, const std::string& ptr,
                                      bool skip_enum) const;

 private:
  absl::StatusOr<nlohmann::ordered_json> Merge(nlohmann::ordered_json a, nlohmann::ordered_json b,
                                               const std::string& ptr, int depth) const;
  absl::StatusOr<nlohmann::ordered_json> Inline(const nlohmann::ordered_json& s,
                                                const std::string& ptr, int depth) const;
  absl::StatusOr<bool> Satisfies(const nlohmann::ordered_json& v, const nlohmann::ordered_json& s,
                                 const std::string& ptr, bool skip_enum, int depth) const;
  uint32_t PossibleTypes(const nlohmann::ordered_json& s, int depth) const;
  bool DisjointAt(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b,
                  int depth) const;

  absl::Status Expired() const;

  const nlohmann::ordered_json& root_;
  std::chrono::steady_clock::time_point deadline_ = std::chrono::steady_clock::time_point::max();
  std::string root_id_;
  bool nested_bases_with_refs_ = false;  // a $ref under a nested $id: refused
};

}  // namespace heavykv::grammar
