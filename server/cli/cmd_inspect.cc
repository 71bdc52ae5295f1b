// heavykv inspect MODEL [--json]: what a model file holds and whether heavykv runs it. A GGUF
// file (told by its magic): its architecture, every metadata key with its type and value (long
// arrays and strings summarized), every tensor (name, type, shape, bytes), the totals, and
// CheckGgufSupported's verdict. A llama2.c checkpoint: its header fields.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/gguf/gguf.h"
#include "engine/model/gguf_support.h"
#include "engine/model/model.h"
#include "nlohmann/json.hpp"
#include "server/cli/commands.h"
#include "server/flags/cli_flags.h"

namespace heavykv::cli {
namespace {

using Json = nlohmann::ordered_json;

constexpr uint64_t kMaxElements = 8;  // array elements shown
constexpr size_t kMaxStringBytes = 80;

// `s` cut to at most kMaxStringBytes, at a UTF-8 character boundary.
std::string Cut(absl::string_view s, bool* cut) {
  *cut = s.size() > kMaxStringBytes;
  if (!*cut) return std::string(s);
  size_t n = kMaxStringBytes;
  while (n > 0 && (static_cast<uint8_t>(s[n]) & 0xC0) == 0x80) --n;
  return std::string(s.substr(0, n));
}

// A string for the text output: quoted, control characters escaped, long ones cut.
std::string QuoteText(absl::string_view s) {
  bool cut;
  std::string out = "\"";
  for (char c : Cut(s, &cut)) {
    const auto u = static_cast<uint8_t>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (u < 0x20 || u == 0x7f) {
      out += absl::StrFormat("\\x%02x", u);
    } else {
      out += c;
    }
  }
  out += '"';
  if (cut) absl::StrAppend(&out, "... (", s.size(), " bytes)");
  return out;
}

std::string ScalarText(const GgufScalar& v) {
  if (const uint64_t* u = std::get_if<uint64_t>(&v)) return absl::StrCat(*u);
  if (const int64_t* i = std::get_if<int64_t>(&v)) return absl::StrCat(*i);
  if (const double* d = std::get_if<double>(&v)) return absl::StrFormat("%.9g", *d);
  if (const bool* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  return QuoteText(std::get<absl::string_view>(v));
}

Json ScalarJson(const GgufScalar& v) {
  if (const uint64_t* u = std::get_if<uint64_t>(&v)) return *u;
  if (const int64_t* i = std::get_if<int64_t>(&v)) return *i;
  if (const double* d = std::get_if<double>(&v)) return *d;
  if (const bool* b = std::get_if<bool>(&v)) return *b;
  bool cut;
  return Cut(std::get<absl::string_view>(v), &cut);
}

std::string TypeText(const GgufMetadata& m) {
  if (!m.is_array()) return std::string(GgufValueTypeName(m.type));
  return absl::StrCat("array[", GgufValueTypeName(m.element_type), "]");
}

std::string ShapeText(const GgufTensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.shape(), ", "), "]");
}

struct Totals {
  int64_t params = 0, bytes = 0;
};

Totals Sum(const GgufFile& f) {
  Totals t;
  for (const GgufTensor& x : f.tensors()) {
    t.params += x.num_elements;
    t.bytes += static_cast<int64_t>(x.data.size());
  }
  return t;
}

std::string ArchitectureOf(const GgufFile& f) {
  absl::StatusOr<absl::string_view> a = f.GetString("general.architecture");
  return a.ok() ? std::string(*a) : "(none)";
}

void PrintGgufText(const GgufFile& f, const absl::Status& verdict) {
  std::printf("file: %s\nformat: GGUF v%u, %llu bytes, alignment %llu, data section at %llu\n",
              f.path().c_str(), f.version(), static_cast<unsigned long long>(f.file_size()),
              static_cast<unsigned long long>(f.alignment()),
              static_cast<unsigned long long>(f.data_offset()));
  std::printf("architecture: %s\n", ArchitectureOf(f).c_str());
  std::printf("metadata: %zu keys\n", f.metadata().size());
  for (const GgufMetadata& m : f.metadata()) {
    std::string value;
    if (!m.is_array()) {
      value = ScalarText(m.Value());
    } else {
      std::vector<std::string> shown;
      for (uint64_t i = 0; i < m.count && i < kMaxElements; ++i) {
        shown.push_back(ScalarText(m.Element(i)));
      }
      value = absl::StrCat(m.count, " [", absl::StrJoin(shown, ", "),
                           m.count > kMaxElements ? ", ...]" : "]");
    }
    std::printf("  %-40s %-14s %s\n", std::string(m.key).c_str(), TypeText(m).c_str(),
                value.c_str());
  }
  std::printf("tensors: %zu\n", f.tensors().size());
  for (const GgufTensor& t : f.tensors()) {
    std::printf("  %-40s %-5s %-22s %zu bytes\n", std::string(t.name).c_str(),
                std::string(GgmlTypeName(t.type)).c_str(), ShapeText(t).c_str(), t.data.size());
  }
  const Totals total = Sum(f);
  std::printf("total: %lld parameters, %lld bytes of tensor data\n",
              static_cast<long long>(total.params), static_cast<long long>(total.bytes));
  std::printf("supported: %s\n",
              verdict.ok() ? "yes" : absl::StrCat("no (", verdict.message(), ")").c_str());
}

Json GgufJson(const GgufFile& f, const absl::Status& verdict) {
  Json j;
  j["file"] = f.path();
  j["format"] = "gguf";
  j["version"] = f.version();
  j["file_bytes"] = f.file_size();
  j["alignment"] = f.alignment();
  j["data_offset"] = f.data_offset();
  j["architecture"] = ArchitectureOf(f);
  Json metadata = Json::array();
  for (const GgufMetadata& m : f.metadata()) {
    Json e;
    e["key"] = std::string(m.key);
    e["type"] = std::string(GgufValueTypeName(m.type));
    if (!m.is_array()) {
      e["value"] = ScalarJson(m.Value());
      if (m.type == GgufValueType::kString && m.raw.size() > kMaxStringBytes) {
        e["bytes"] = m.raw.size();
      }
    } else {
      e["element_type"] = std::string(GgufValueTypeName(m.element_type));
      e["count"] = m.count;
      Json values = Json::array();
      for (uint64_t i = 0; i < m.count && i < kMaxElements; ++i) {
        values.push_back(ScalarJson(m.Element(i)));
      }
      e["first"] = values;
    }
    metadata.push_back(e);
  }
  j["metadata"] = metadata;
  Json tensors = Json::array();
  for (const GgufTensor& t : f.tensors()) {
    tensors.push_back({{"name", std::string(t.name)},
                       {"type", std::string(GgmlTypeName(t.type))},
                       {"shape", std::vector<int64_t>(t.shape().begin(), t.shape().end())},
                       {"elements", t.num_elements},
                       {"bytes", t.data.size()},
                       {"offset", t.offset}});
  }
  j["tensors"] = tensors;
  const Totals total = Sum(f);
  j["total_parameters"] = total.params;
  j["total_bytes"] = total.bytes;
  j["supported"] = verdict.ok();
  if (!verdict.ok()) j["reason"] = std::string(verdict.message());
  return j;
}

int InspectCheckpoint(const std::string& path, bool json) {
  absl::StatusOr<ModelConfig> c = ReadModelConfig(path);
  if (!c.ok()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "not a GGUF file (no GGUF magic), nor a llama2.c checkpoint: ", c.status().message())));
  }
  std::error_code ec;
  const uintmax_t bytes = std::filesystem::file_size(path, ec);
  Json j;
  j["file"] = path;
  j["format"] = "llama2.c";
  j["file_bytes"] = ec ? 0 : bytes;
  j["dim"] = c->dim;
  j["hidden_dim"] = c->hidden_dim;
  j["n_layers"] = c->num_layers;
  j["n_heads"] = c->num_heads;
  j["n_kv_heads"] = c->num_kv_heads;
  j["vocab_size"] = c->vocab_size;
  j["seq_len"] = c->seq_len;
  j["shared_classifier"] = c->shared_classifier;
  j["total_parameters"] = c->NumParams();
  j["supported"] = true;
  if (json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("file: %s\nformat: llama2.c checkpoint, %ju bytes\n", path.c_str(),
              static_cast<uintmax_t>(ec ? 0 : bytes));
  for (const char* k : {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size",
                        "seq_len", "shared_classifier"}) {
    std::printf("  %-18s %s\n", k, j[k].dump().c_str());
  }
  std::printf("total: %lld parameters\nsupported: yes\n", static_cast<long long>(c->NumParams()));
  return 0;
}

}  // namespace

int InspectCommand(int argc, char** argv) {
  std::string model_path;
  bool json = false;
  FlagSet flags("inspect",
                "heavykv inspect MODEL [--json]   (a GGUF file or a llama2.c checkpoint)");
  flags.String("model", &model_path, "the model file (or give it as the argument)");
  flags.Bool("json", &json, "print one JSON object instead of the text");
  if (std::optional<int> code = ParseOrExit(flags, argc, argv)) return *code;
  const std::vector<std::string>& args = flags.positional();
  if (model_path.empty() && args.size() == 1) {
    model_path = args[0];
  } else if (!args.empty() || model_path.empty()) {
    return Fail(absl::InvalidArgumentError("give exactly one model file: heavykv inspect MODEL"));
  }
  if (!std::filesystem::exists(model_path)) {
    return Fail(absl::NotFoundError(absl::StrCat(model_path, ": no such file")));
  }
  if (!IsGgufFile(model_path)) return InspectCheckpoint(model_path, json);
  absl::StatusOr<GgufFile> f = GgufFile::Open(model_path);
  if (!f.ok()) return Fail(f.status());
  const absl::Status verdict = CheckGgufSupported(*f);
  if (json) {
    std::printf("%s\n",
                GgufJson(*f, verdict).dump(2, ' ', false, Json::error_handler_t::replace).c_str());
  } else {
    PrintGgufText(*f, verdict);
  }
  return 0;
}

}  // namespace heavykv::cli
