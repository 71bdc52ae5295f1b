// The filters, tests, str/dict methods and global functions of the chat-template interpreter
// (engine/chat/chat_template.h), each with the semantics jinja2 3.1 and Python 3 give it, and the
// budget that bounds one render.
//
// Filters: abs capitalize count d default first float indent int items join last length list
// lower map max min reject rejectattr replace reverse round safe select selectattr sort string
// sum title tojson trim unique upper.
// Tests: boolean callable defined divisibleby eq equalto even false float ge gt in integer
// iterable le lower lt mapping ne none number odd sameas sequence string true undefined upper,
// and == != < <= > >=.
// str methods: capitalize endswith find join lower lstrip replace rstrip split startswith strip
// title upper; dict methods: get items keys values.
// Globals: dict namespace raise_exception range strftime_now.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "engine/chat/chat_template_value.h"

namespace heavykv::jinja {

// Steps and sizes left to one render; RESOURCE_EXHAUSTED once spent.
class Budget {
 public:
  Budget(int64_t steps, int64_t max_bytes) : steps_left_(steps), max_bytes_(max_bytes) {}
  absl::Status Charge(int64_t steps) {
    steps_left_ -= steps;
    if (steps_left_ < 0) {
      return absl::ResourceExhaustedError("chat template: too much work (step limit reached)");
    }
    return absl::OkStatus();
  }
  // For a string or list about to be built with `size` bytes or items: charged by size, and
  // refused past the byte limit.
  absl::Status Size(int64_t size) {
    if (size > max_bytes_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("chat template: a value or the output would exceed ", max_bytes_, " bytes"));
    }
    return Charge(size / 64);
  }
  // For a list about to be built with `count` items: as Size, at kItemBytes a list item.
  absl::Status Items(int64_t count) {
    if (count > max_bytes_ / kItemBytes) return Size(max_bytes_ + 1);
    return Size(count * kItemBytes);
  }
  int64_t max_bytes() const { return max_bytes_; }
  static constexpr int64_t kItemBytes = 16;

 private:
  int64_t steps_left_;
  int64_t max_bytes_;
};

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // Positional argument `index`, else keyword `name`, else null.
  const Value* Get(size_t index, const char* name) const;
};

struct BuiltinContext {
  Budget* budget;
  absl::Time now;
  // Every namespace() made in this render. A namespace may hold itself (`set ns.me = ns`), a
  // reference cycle, so the render empties them all when it ends.
  std::vector<Value> namespaces;
};

// raise_exception's status: ABORTED carrying the template's message (Render reports it as
// INVALID_ARGUMENT without a location).
inline constexpr absl::StatusCode kRaisedCode = absl::StatusCode::kAborted;

bool IsGlobal(const std::string& name);
absl::StatusOr<Value> CallGlobal(const std::string& name, const Args& args, BuiltinContext& ctx);
absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& subject, const Args& args,
                                  BuiltinContext& ctx);
absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& subject, const Args& args);
// self.name(args) for a str, dict or list.
absl::StatusOr<Value> CallMethod(const Value& self, const std::string& name, const Args& args,
                                 BuiltinContext& ctx);

// jinja2's environment.getattr / getitem: a dict's key, a sequence's index (negative from the
// end), else undefined; an error for undefined itself.
absl::StatusOr<Value> GetAttr(const Value& obj, const std::string& name);
absl::StatusOr<Value> GetItem(const Value& obj, const Value& key);
// The items `for` iterates: a list's items, a dict's keys, a string's characters; nothing for
// undefined; an error for other types.
absl::StatusOr<std::vector<Value>> Iterate(const Value& v);
// Python's len().
absl::StatusOr<int64_t> Length(const Value& v);
absl::Status UndefinedError(const Value& v);

// Helpers shared by the builtins' sources (chat_template_builtins.cc, chat_template_filters.cc).
// Python's TypeError as INVALID_ARGUMENT.
absl::Status TypeError(const std::string& what);
// Argument `index` or keyword `name`: a str (else an error naming `fn`), an int or a truth value
// (else `fallback`).
absl::StatusOr<std::string> StrArg(const Args& args, size_t index, const char* name,
                                   const char* fn);
int64_t IntArg(const Args& args, size_t index, const char* name, int64_t fallback);
bool BoolArg(const Args& args, size_t index, const char* name, bool fallback);
// A dotted attribute path ("a.b", "0") looked up as jinja2's make_attrgetter does.
absl::StatusOr<Value> AttrPath(const Value& v, const std::string& path);

}  // namespace heavykv::jinja
