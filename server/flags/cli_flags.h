// FlagSet: the flags of one `heavykv` subcommand. Each subcommand owns its flags, so an unknown or
// malformed flag is reported with the subcommand's name and its list of flags.
//
//   FlagSet flags("run", "heavykv run --model FILE [flags]");
//   flags.String("model", &model_path, "llama2.c checkpoint");
//   if (absl::Status s = flags.Parse(argc, argv); !s.ok()) ...
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace heavykv::cli {

class FlagSet {
 public:
  FlagSet(std::string command, std::string usage);

  void String(const std::string& name, std::string* dst, const std::string& help);
  void Int(const std::string& name, int64_t* dst, const std::string& help);
  void Double(const std::string& name, double* dst, const std::string& help);
  void Bool(const std::string& name, bool* dst, const std::string& help);

  // Parses argv[first..argc): "--name value", "--name=value", a bare "--name" for booleans;
  // other arguments are positional. "--help" sets help_requested(). INVALID_ARGUMENT on an
  // unknown flag, a missing value or a value of the wrong type.
  absl::Status Parse(int argc, char** argv, int first = 2);

  bool IsSet(const std::string& name) const;
  bool help_requested() const { return help_; }
  const std::vector<std::string>& positional() const { return positional_; }
  std::string Help() const;

 private:
  struct Flag {
    std::string name, help, default_text;
    bool is_bool = false;
    bool set = false;
    std::function<bool(const std::string&)> assign;
  };
  Flag* Find(const std::string& name);

  std::string command_, usage_;
  std::vector<Flag> flags_;
  std::vector<std::string> positional_;
  bool help_ = false;
};

// Parses a subcommand's flags: returns the exit code when the command must stop now (0 after
// printing --help, 2 after printing the error), nullopt when it should go on.
std::optional<int> ParseOrExit(FlagSet& flags, int argc, char** argv);

// Prints "error: <message>" to stderr and returns the exit code 2.
int Fail(const absl::Status& status);

// Splits "a,b,c" into its non-empty parts.
std::vector<std::string> SplitList(const std::string& list);

// `value` as one line of compact JSON and a newline on stdout (the commands' --json output;
// invalid UTF-8 becomes U+FFFD). An ordered_json keeps the keys in the order they were set.
void PrintJsonLine(const nlohmann::ordered_json& value);

// `v` rounded to `digits` decimals, so that JSON prints it short (0.001546, not 0.00154600000001).
double Rounded(double v, int digits);

}  // namespace heavykv::cli
