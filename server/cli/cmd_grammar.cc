// heavykv grammar: structured-output constraints against a model's vocabulary (as llama.cpp's
// gbnf-validator, docs/ARCHITECTURE.md "Structured outputs").
//
//   heavykv grammar --model VOCAB.gguf (--schema FILE | --json-object | --regex RE |
//                   --choices JSON_LIST | --gbnf FILE) [--print] [--text TEXT]
//     compiles it; one JSON line: compiled, error, compile_us, rules, elements, and with --text
//     whether TEXT matches (byte by byte and token by token).
//   heavykv grammar test --model VOCAB.gguf FILE...
//     each FILE holds a JSON-Schema-Test-Suite group {"schema", "tests": [{"data", "valid"}]}
//     or a list of them. Each instance is written as json.dumps(data, ensure_ascii=False),
//     tokenized without BOS and walked token by token through the masks: a valid one passes when
//     every token and then the end are allowed, an invalid one when some token or the end is
//     refused. One JSON line per group and a summary line last.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/gguf/gguf.h"
#include "engine/grammar/constraint.h"
#include "engine/grammar/test_suite.h"
#include "nlohmann/json.hpp"
#include "server/cli/commands.h"
#include "server/flags/cli_flags.h"

namespace heavykv::cli {
namespace {

using ojson = nlohmann::ordered_json;
using grammar::ConstraintSpec;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

double Micros(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}
ojson Percentiles(const std::vector<double>& v) {
  if (v.empty()) return ojson{{"p50", nullptr}, {"p99", nullptr}, {"max", nullptr}};
  const auto round = [](double x) { return std::round(x * 10) / 10; };
  return ojson{{"p50", round(grammar::Quantile(v, 0.5))},
               {"p99", round(grammar::Quantile(v, 0.99))},
               {"max", round(*std::max_element(v.begin(), v.end()))}};
}

int TestCommand(grammar::ConstraintCompiler& compiler, const TextTokenizer& tok,
                const std::vector<std::string>& files) {
  std::vector<double> all_mask_us, compile_us;
  int64_t groups = 0, compiled = 0, all_passed = 0, tests = 0, passed = 0, valid_rejected = 0,
          invalid_accepted = 0, tokens = 0;
  for (const std::string& path : files) {
    absl::StatusOr<std::string> text = ReadFile(path);
    if (!text.ok()) return Fail(text.status());
    ojson doc = ojson::parse(*text, nullptr, false);
    if (doc.is_discarded()) return Fail(absl::InvalidArgumentError(path + " is not JSON"));
    if (!doc.is_array()) doc = ojson::array({doc});
    for (const ojson& group : doc) {
      ++groups;
      const grammar::GroupResult g = grammar::RunSchemaGroup(compiler, tok, group);
      ojson line = {{"file", path},
                    {"description", group.is_object() ? group.value("description", "") : ""},
                    {"compiled", g.compiled},
                    {"error", g.compiled ? ojson(nullptr) : ojson(g.error)},
                    {"compile_us", std::round(g.compile_us)},
                    {"tests", g.tests},
                    {"passed", g.passed},
                    {"valid_rejected", g.valid_rejected},
                    {"invalid_accepted", g.invalid_accepted},
                    {"tokens", g.tokens},
                    {"mask_us", Percentiles(g.mask_us)}};
      std::printf("%s\n", line.dump(-1, ' ', false, ojson::error_handler_t::replace).c_str());
      if (g.compiled) {
        ++compiled;
        compile_us.push_back(g.compile_us);
        if (g.passed == g.tests) ++all_passed;
      }
      tests += g.tests;
      passed += g.passed;
      valid_rejected += g.valid_rejected;
      invalid_accepted += g.invalid_accepted;
      tokens += g.tokens;
      all_mask_us.insert(all_mask_us.end(), g.mask_us.begin(), g.mask_us.end());
    }
  }
  ojson summary = {{"summary", true},
                   {"groups", groups},
                   {"compiled", compiled},
                   {"all_passed", all_passed},
                   {"coverage", groups ? std::round(1000.0 * all_passed / groups) / 1000 : 0},
                   {"tests", tests},
                   {"passed", passed},
                   {"valid_rejected", valid_rejected},
                   {"invalid_accepted", invalid_accepted},
                   {"tokens", tokens},
                   {"mask_us", Percentiles(all_mask_us)},
                   {"compile_us", Percentiles(compile_us)}};
  std::printf("%s\n", summary.dump().c_str());
  return invalid_accepted == 0 ? 0 : 2;
}

}  // namespace

int GrammarCommand(int argc, char** argv) {
  const bool test = argc >= 3 && std::string(argv[2]) == "test";
  std::string model_path, tokenizer_path, schema_path, regex, choices, gbnf_path, text;
  bool json_object = false, print = false;
  FlagSet flags("grammar",
                "heavykv grammar --model VOCAB.gguf (--schema FILE | --json-object | --regex RE |\n"
                "    --choices JSON_LIST | --gbnf FILE) [--print] [--text TEXT]\n"
                "heavykv grammar test --model VOCAB.gguf FILE...\n"
                "Compiles a structured-output constraint against the model's vocabulary and\n"
                "prints one JSON line (compiled, error, compile_us, ...); exit 1 when it does not\n"
                "compile. `test` runs JSON-Schema-Test-Suite files token by token through the\n"
                "masks: one JSON line per group, a summary last; exit 2 if an invalid instance\n"
                "was accepted.");
  flags.String("model", &model_path, "GGUF file whose vocabulary the masks are over");
  flags.String("tokenizer", &tokenizer_path, "llama2.c tokenizer.bin (default: the GGUF's own)");
  flags.String("schema", &schema_path, "a JSON Schema file");
  flags.Bool("json-object", &json_object, "any JSON object (response_format json_object)");
  flags.String("regex", &regex, "a regular expression, matched in full");
  flags.String("choices", &choices, "a JSON list of strings: the output is one of them");
  flags.String("gbnf", &gbnf_path, "a GBNF grammar file (start rule `root`)");
  flags.Bool("print", &print, "also print the compiled grammar's rules to stderr");
  flags.String("text", &text, "check whether TEXT matches");
  if (std::optional<int> code = ParseOrExit(flags, argc - (test ? 1 : 0), argv + (test ? 1 : 0))) {
    return *code;
  }
  if (model_path.empty()) return Fail(absl::InvalidArgumentError("--model is required"));
  absl::StatusOr<std::shared_ptr<const TextTokenizer>> tok =
      LoadTokenizerOnly(model_path, tokenizer_path);
  if (!tok.ok()) return Fail(tok.status());
  grammar::ConstraintCompiler compiler(grammar::TokenVocabulary::FromTokenizer(**tok),
                                       /*max_entries=*/4);
  if (test) {
    if (flags.positional().empty()) {
      return Fail(absl::InvalidArgumentError("give the test FILEs"));
    }
    return TestCommand(compiler, **tok, flags.positional());
  }

  ConstraintSpec spec;
  int given = 0;
  if (!schema_path.empty()) {
    absl::StatusOr<std::string> s = ReadFile(schema_path);
    if (!s.ok()) return Fail(s.status());
    spec.kind = ConstraintSpec::Kind::kJsonSchema;
    spec.text = *s;
    ++given;
  }
  if (json_object) spec.kind = ConstraintSpec::Kind::kJsonObject, ++given;
  if (!regex.empty()) spec.kind = ConstraintSpec::Kind::kRegex, spec.text = regex, ++given;
  if (!gbnf_path.empty()) {
    absl::StatusOr<std::string> s = ReadFile(gbnf_path);
    if (!s.ok()) return Fail(s.status());
    spec.kind = ConstraintSpec::Kind::kGbnf;
    spec.text = *s;
    ++given;
  }
  if (!choices.empty()) {
    const ojson list = ojson::parse(choices, nullptr, false);
    if (!list.is_array()) return Fail(absl::InvalidArgumentError("--choices is a JSON list"));
    for (const ojson& c : list) {
      if (!c.is_string()) return Fail(absl::InvalidArgumentError("--choices holds strings"));
      spec.choices.push_back(c.get<std::string>());
    }
    spec.kind = ConstraintSpec::Kind::kChoice;
    ++given;
  }
  if (given != 1) {
    return Fail(absl::InvalidArgumentError(
        "give one of --schema, --json-object, --regex, --choices, --gbnf"));
  }
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::shared_ptr<const grammar::CompiledConstraint>> c = compiler.Compile(spec);
  const double us = Micros(std::chrono::steady_clock::now() - t0);
  ojson line = {{"kind", spec.KindName()}, {"compiled", c.ok()}};
  if (!c.ok()) {
    line["error"] = std::string(c.status().message());
    std::printf("%s\n", line.dump(-1, ' ', false, ojson::error_handler_t::replace).c_str());
    return 1;
  }
  const grammar::Grammar& g = (*c)->automaton->grammar();
  line["compile_us"] = std::round(us);
  line["rules"] = g.rules.size();
  line["elements"] = g.NumElements();
  if (print) std::fprintf(stderr, "%s", g.ToString().c_str());
  if (flags.positional().size() > 0 || !text.empty()) {
    if (text.empty()) text = flags.positional()[0];
    line["bytes_match"] = grammar::Matches(g, text);
    std::vector<double> mask_us;
    line["tokens_match"] = grammar::WalkTokens(
        *c, grammar::TokensOfExactly(**tok, *(*c)->automaton->vocab(), text), mask_us);
    if (absl::Status s = (*c)->automaton->status(); !s.ok()) {
      line["automaton_error"] = std::string(s.message());  // a limit the walk passed
    }
    line["mask_us"] = Percentiles(mask_us);
  }
  std::printf("%s\n", line.dump(-1, ' ', false, ojson::error_handler_t::replace).c_str());
  return 0;
}

}  // namespace heavykv::cli
