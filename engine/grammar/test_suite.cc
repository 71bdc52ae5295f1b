#include "engine/grammar/test_suite.h"

#include <algorithm>
#include <chrono>
#include <string_view>

#include "engine/grammar/json_text.h"

namespace heavykv::grammar {
namespace {

double Micros(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

bool Allowed(const std::vector<uint64_t>& words, int32_t t) {
  return (words[size_t(t) >> 6] >> (t & 63)) & 1;
}

}  // namespace

std::vector<int32_t> TokensOfExactly(const TextTokenizer& tokenizer, const TokenVocabulary& vocab,
                                     std::string_view text) {
  std::vector<int32_t> ids =
      tokenizer.Encode(text, /*bos=*/false, /*eos=*/false, {}, /*parse_special=*/false)
          .value_or(std::vector<int32_t>());
  std::string bytes;
  for (int32_t id : ids) bytes += vocab.IsText(id) ? vocab.bytes(id) : std::string();
  if (bytes == text) return ids;
  // SentencePiece writes a space before the text: take the longest token at each byte instead.
  ids.clear();
  for (size_t at = 0; at < text.size();) {
    const auto [id, n] = vocab.LongestPrefixToken(text.substr(at));
    if (id < 0) return {};  // a byte no token starts with
    ids.push_back(id);
    at += n;
  }
  return ids;
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size())))];
}

bool WalkTokens(const std::shared_ptr<const CompiledConstraint>& c,
                const std::vector<int32_t>& ids, std::vector<double>& mask_us,
                int32_t* tokens_walked) {
  const TokenVocabulary& v = *c->automaton->vocab();
  ConstraintMatcher m(c);
  std::vector<uint64_t> words(size_t(v.num_words()));
  const auto fill = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    m.FillMask(words);
    mask_us.push_back(Micros(std::chrono::steady_clock::now() - t0));
  };
  int32_t walked = 0;
  bool ok = true;
  for (int32_t id : ids) {
    fill();
    ++walked;
    if (!Allowed(words, id) || !m.Accept(id).ok()) {
      ok = false;
      break;
    }
  }
  if (ok) {
    fill();
    bool end = false;
    for (int32_t e : v.eog_ids()) end |= Allowed(words, e);
    ok = end;
  }
  if (tokens_walked != nullptr) *tokens_walked = walked;
  return ok;
}

GroupResult RunSchemaGroup(ConstraintCompiler& compiler, const TextTokenizer& tokenizer,
                           const nlohmann::ordered_json& group) {
  GroupResult r;
  ConstraintSpec spec;
  spec.kind = ConstraintSpec::Kind::kJsonSchema;
  spec.text = group.contains("schema") ? group["schema"].dump() : "{}";
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::shared_ptr<const CompiledConstraint>> c = compiler.Compile(spec);
  r.compile_us = Micros(std::chrono::steady_clock::now() - t0);
  r.compiled = c.ok();
  if (!c.ok()) r.error = std::string(c.status().message());
  const auto it = group.find("tests");
  if (it == group.end() || !it->is_array()) return r;
  r.tests = int64_t(it->size());
  if (!c.ok()) return r;
  for (const nlohmann::ordered_json& t : *it) {
    const auto data = t.find("data");
    const std::string text = PythonJsonDumps(data != t.end() ? *data : nlohmann::ordered_json());
    const auto valid_it = t.find("valid");
    const bool valid = valid_it != t.end() && valid_it->is_boolean() && valid_it->get<bool>();
    const std::vector<int32_t> ids = TokensOfExactly(tokenizer, *(*c)->automaton->vocab(), text);
    int32_t walked = 0;
    const bool allowed = WalkTokens(*c, ids, r.mask_us, &walked);
    r.tokens += walked;
    if (allowed == valid) {
      ++r.passed;
    } else if (valid) {
      ++r.valid_rejected;
    } else {
      ++r.invalid_accepted;
    }
  }
  return r;
}

}  // namespace heavykv::grammar
