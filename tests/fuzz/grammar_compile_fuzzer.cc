// Fuzzes the compilers into the byte grammar (engine/grammar/regex.h, gbnf.h): arbitrary input
// as a regular expression or a GBNF grammar, then a text matched against what compiled. Input:
//   flags byte | pattern or grammar | '\0' | a text to match (optional)
// (flags bit 0: GBNF, else a regex; bit 1: the regex is a search, JSON Schema's `pattern`).
// The seeds in tests/fuzz/corpus/grammar_compile_fuzzer/ are llama.cpp's example grammars and
// real-world patterns in this layout. A compile returns a grammar, INVALID_ARGUMENT or
// RESOURCE_EXHAUSTED, never crashes, hangs or passes the (small) limits; compiling twice gives
// the same grammar, and matching the text is bounded.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "engine/grammar/automaton.h"
#include "engine/grammar/gbnf.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/regex.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using heavykv::grammar::Grammar;
using heavykv::grammar::GrammarBuilder;
using heavykv::grammar::GrammarLimits;

absl::StatusOr<Grammar> Compile(bool gbnf, bool search, std::string_view source,
                                const GrammarLimits& limits) {
  if (gbnf) return heavykv::grammar::CompileGbnf(source, "root", limits);
  GrammarBuilder b(limits);
  absl::StatusOr<GrammarBuilder::Expr> e =
      heavykv::grammar::CompileRegex(b, source, {.search = search});
  if (!e.ok()) return e.status();
  const heavykv::grammar::RuleId root = b.DeclareRule("root");
  b.DefineRule(root, *e);
  return std::move(b).Build(root);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool gbnf = data[0] & 1, search = data[0] & 2;
  const std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t nul = input.find('\0');
  const std::string_view source = input.substr(0, nul);
  const std::string_view text = nul == std::string_view::npos ? "" : input.substr(nul + 1);

  // Small limits keep each input fast; they are the same code paths as the defaults.
  GrammarLimits limits;
  limits.max_elements = 200'000;
  limits.max_repeat = 200;
  limits.max_depth = 32;
  absl::StatusOr<Grammar> g = Compile(gbnf, search, source, limits);
  if (!g.ok()) {
    const absl::StatusCode code = g.status().code();
    if (code != absl::StatusCode::kInvalidArgument &&
        code != absl::StatusCode::kResourceExhausted) {
      heavykv::fuzz::Die("a compile failed with " + g.status().ToString());
    }
    return 0;
  }
  if (g->NumElements() > limits.max_elements) heavykv::fuzz::Die("a grammar past max_elements");
  absl::StatusOr<Grammar> again = Compile(gbnf, search, source, limits);
  if (!again.ok() || again->ToString() != g->ToString()) {
    heavykv::fuzz::Die("compiling twice gave two grammars");
  }
  heavykv::grammar::AutomatonLimits automaton_limits;
  automaton_limits.max_frames = 200'000;
  heavykv::grammar::Automaton a(std::make_shared<const Grammar>(*std::move(g)), nullptr,
                                automaton_limits);
  int32_t state = a.Start();
  for (size_t i = 0; i < text.size() && state != heavykv::grammar::Automaton::kDead; ++i) {
    state = a.Step(state, uint8_t(text[i]));
  }
  if (state != heavykv::grammar::Automaton::kDead) a.Accepting(state);
  return 0;
}
