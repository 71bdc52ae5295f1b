#include "server/flags/cli_flags.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace heavykv::cli {

FlagSet::FlagSet(std::string command, std::string usage)
    : command_(std::move(command)), usage_(std::move(usage)) {}

void FlagSet::String(const std::string& name, std::string* dst, const std::string& help) {
  flags_.push_back({name, help, *dst, false, false, [dst](const std::string& v) {
                      *dst = v;
                      return true;
                    }});
}

void FlagSet::Int(const std::string& name, int64_t* dst, const std::string& help) {
  flags_.push_back({name, help, absl::StrCat(*dst), false, false,
                    [dst](const std::string& v) { return absl::SimpleAtoi(v, dst); }});
}

void FlagSet::Double(const std::string& name, double* dst, const std::string& help) {
  flags_.push_back({name, help, absl::StrCat(*dst), false, false,
                    [dst](const std::string& v) { return absl::SimpleAtod(v, dst); }});
}

void FlagSet::Bool(const std::string& name, bool* dst, const std::string& help) {
  flags_.push_back({name, help, *dst ? "true" : "false", true, false,
                    [dst](const std::string& v) { return absl::SimpleAtob(v, dst); }});
}

FlagSet::Flag* FlagSet::Find(const std::string& name) {
  for (Flag& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

bool FlagSet::IsSet(const std::string& name) const {
  for (const Flag& f : flags_) {
    if (f.name == name) return f.set;
  }
  return false;
}

absl::Status FlagSet::Parse(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (name == "help") {
      help_ = true;
      continue;
    }
    Flag* f = Find(name);
    if (f == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("heavykv ", command_, ": unknown flag --", name, "\n", Help()));
    }
    if (!has_value) {
      if (f->is_bool) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("heavykv ", command_, ": flag --", name, " needs a value"));
      }
    }
    if (!f->assign(value)) {
      return absl::InvalidArgumentError(absl::StrCat("heavykv ", command_, ": bad value \"",
                                                     value, "\" for --", name, " (", f->help,
                                                     ")"));
    }
    f->set = true;
  }
  return absl::OkStatus();
}

std::string FlagSet::Help() const {
  std::string out = absl::StrCat("usage: ", usage_, "\nflags:\n");
  for (const Flag& f : flags_) {
    absl::StrAppendFormat(&out, "  --%-18s %s", f.name, f.help);
    if (!f.default_text.empty()) absl::StrAppend(&out, " (default: ", f.default_text, ")");
    absl::StrAppend(&out, "\n");
  }
  return out;
}

std::optional<int> ParseOrExit(FlagSet& flags, int argc, char** argv) {
  absl::Status st = flags.Parse(argc, argv);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return 0;
  }
  if (!st.ok()) return Fail(st);
  return std::nullopt;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "error: %s\n", std::string(status.message()).c_str());
  return 2;
}

std::vector<std::string> SplitList(const std::string& list) {
  return absl::StrSplit(list, ',', absl::SkipEmpty());
}

void PrintJsonLine(const nlohmann::ordered_json& value) {
  const std::string line =
      value.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
}

double Rounded(double v, int digits) {
  // Through decimal text: the double nearest the rounded decimal, which prints as that decimal
  // (v * 10^d rounded and divided back can land an ulp away and print 17 digits).
  if (!std::isfinite(v)) return v;
  return std::strtod(absl::StrFormat("%.*f", digits, v).c_str(), nullptr);
}

}  // namespace heavykv::cli
