// The pre-tokenizers' regular expressions are facts of each tokenizer's definition (its
// tokenizer.json "pre_tokenizer"), with the names llama.cpp's convert script writes into
// `tokenizer.ggml.pre`. Where llama.cpp rewrote an expression for std::regex (no \p{Lu} or (?i:)),
// PCRE2 takes the original, except the contractions: '[sS] rather than (?i:'s), because Unicode
// case folding would also fold U+017F (long s) and U+212A (Kelvin) into them.
#include "engine/tokenizer/bpe_pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace heavykv {
namespace {

// GPT-2's expression: contractions, letters, numbers, other symbols, each with one optional
// leading space, and runs of whitespace not followed by a non-space.
constexpr const char* kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
// Llama 3's (tiktoken cl100k-like): numbers in groups of up to three digits, newlines kept apart.
constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2's: Llama 3's with single digits.
constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|)"
    R"(\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Tekken's (Mistral NeMo): splits CamelCase words, keeps '/' after symbols.
constexpr const char* kTekken =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|)"
    R"(\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// DeepSeek's CJK runs (the LLM's and the Coder's).
constexpr const char* kDeepSeekCjk = "[一-龥ࠀ-一가-퟿]+";
// DeepSeek LLM's letters: the cased letters of its tokenizer.json, spelled out.
constexpr const char* kDeepSeekLetters =
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-"
    "ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-"
    "ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-"
    "𑣟𞤀-𞥃]+";

struct Definition {
  std::vector<const char*> names;
  std::vector<const char*> patterns;
  bool ignore_merges = false;
  bool add_bos = false;
};

// llama.cpp's names for each expression set (convert_hf_to_gguf.py's `tokenizer.ggml.pre`).
const std::vector<Definition>& Definitions() {
  static const auto* defs = new std::vector<Definition>{
      {{"default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"}},
      {{"llama-bpe", "llama3", "llama-v3", "falcon3", "dbrx", "smaug-bpe", "chatglm-bpe"},
       {kLlama3},
       /*ignore_merges=*/true,
       /*add_bos=*/true},
      {{"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"}, {kQwen2}},
      {{"gpt-2", "phi-2", "roberta-bpe", "jina-es", "jina-de", "jina-v1-en", "jina-v2-es",
        "jina-v2-de", "jina-v2-code", "gigachat", "mpt", "olmo", "jais"},
       {kGpt2}},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"},
       {R"(\p{N})", kGpt2}},
      {{"deepseek-llm"},
       {"[\r\n]", kDeepSeekLetters, R"(\s?[!-/:-~！-／：-～‘-‟　-。]+)", R"(\s+$)", kDeepSeekCjk,
        R"(\p{N}+)"}},
      {{"deepseek-coder"}, {"[\r\n]", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepSeekCjk, R"(\p{N})"}},
      {{"deepseek-v3"},
       {R"(\p{N}{1,3})", "[一-龥぀-ゟ゠-ヿ]+",
        R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|)"
        R"( ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"}},
      {{"poro-chat", "bloom", "gpt3-finnish"}, {R"( ?[^(\s|.,!?…。，、।۔،)]+)"}},
      {{"viking"}, {R"( ?[^(\s|.,!?…。，、।۔،)]+)", R"(\p{N})"}},
      {{"tekken"}, {kTekken}, /*ignore_merges=*/true, /*add_bos=*/true},
  };
  return *defs;
}

// Length of the valid UTF-8 sequence at s[i] (1..4), or 0 when the bytes there are not one
// (overlong forms, surrogates and code points above U+10FFFF are invalid, as PCRE2 has them).
size_t Utf8Length(std::string_view s, size_t i) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = at(i);
  if (c < 0x80) return 1;
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (s.size() - i < len) return 0;
  if (at(i + 1) < lo || at(i + 1) > hi) return 0;
  for (size_t k = 2; k < len; ++k) {
    if ((at(i + k) & 0xC0) != 0x80) return 0;
  }
  return len;
}

}  // namespace

struct PreTokenizer::Pattern {
  explicit Pattern(pcre2_code* c) : code(c) {}
  ~Pattern() { pcre2_code_free(code); }
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;
  pcre2_code* code;
};

absl::StatusOr<PreTokenizer> PreTokenizer::Create(absl::string_view name) {
  for (const Definition& def : Definitions()) {
    for (const char* n : def.names) {
      if (name != n) continue;
      absl::StatusOr<PreTokenizer> pre =
          FromPatterns(std::vector<std::string>(def.patterns.begin(), def.patterns.end()), name);
      if (!pre.ok()) return pre.status();
      pre->ignore_merges_ = def.ignore_merges;
      pre->default_add_bos_ = def.add_bos;
      return pre;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown BPE pre-tokenizer '", name,
                                                 "' (tokenizer.ggml.pre); heavykv knows ",
                                                 absl::StrJoin(Names(), ", ")));
}

absl::StatusOr<PreTokenizer> PreTokenizer::FromPatterns(const std::vector<std::string>& patterns,
                                                        absl::string_view name) {
  PreTokenizer pre;
  pre.name_ = std::string(name);
  for (const std::string& p : patterns) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    // DOLLAR_ENDONLY: `$` is the piece's end, not also before a final newline (as std::regex and
    // Rust's regex have it).
    pcre2_code* code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                      PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &error, &offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      return absl::InvalidArgumentError(absl::StrCat("pre-tokenizer '", name, "': pattern /", p,
                                                     "/ does not compile at offset ", offset, ": ",
                                                     reinterpret_cast<const char*>(message)));
    }
    // Without a JIT (some platforms, or PCRE2 built without one) the interpreter matches alike.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    pre.patterns_.push_back(std::make_shared<const Pattern>(code));
  }
  return pre;
}

std::vector<std::string> PreTokenizer::Names() {
  std::vector<std::string> names;
  for (const Definition& def : Definitions()) {
    names.insert(names.end(), def.names.begin(), def.names.end());
  }
  std::sort(names.begin(), names.end());
  return names;
}

void PreTokenizer::Split(std::string_view text, std::vector<Span>* spans) const {
  std::vector<Span> pieces, cut;
  size_t i = 0;
  while (i < text.size()) {
    // The longest valid UTF-8 run from i; PCRE2 in UTF mode takes valid text only.
    size_t j = i;
    while (j < text.size()) {
      if (static_cast<unsigned char>(text[j]) < 0x80) {
        ++j;
        continue;
      }
      const size_t len = Utf8Length(text, j);
      if (len == 0) break;
      j += len;
    }
    if (j > i) {
      pieces.assign(1, Span{i, j});
      for (const auto& pattern : patterns_) {
        cut.clear();
        Apply(*pattern, text, pieces, &cut);
        pieces.swap(cut);
      }
      spans->insert(spans->end(), pieces.begin(), pieces.end());
    }
    if (j < text.size()) spans->push_back(Span{j, j + 1});  // an invalid byte: a piece of its own
    i = j < text.size() ? j + 1 : j;
  }
}

void PreTokenizer::Apply(const Pattern& pattern, std::string_view text, const std::vector<Span>& in,
                         std::vector<Span>* out) {
  pcre2_match_data* match = pcre2_match_data_create(1, nullptr);
  for (const Span& piece : in) {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + piece.begin);
    const size_t length = piece.end - piece.begin;
    size_t gap = 0;    // start of the text not yet emitted
    size_t start = 0;  // where the next search starts
    while (start < length) {
      int rc =
          pcre2_match(pattern.code, subject, length, start, PCRE2_NO_UTF_CHECK, match, nullptr);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
        rc = pcre2_match(pattern.code, subject, length, start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                         match, nullptr);
      }
      // No further match, or a match or heap limit hit (pathological input): the rest of the
      // piece stays one piece, which byte-level BPE still encodes.
      if (rc < 0) break;
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
      const size_t begin = ovector[0], end = ovector[1];
      if (end == begin) {  // an empty match (no built-in pattern has one): step one character
        if (begin >= length) break;
        start = begin + std::max<size_t>(1, Utf8Length(text, piece.begin + begin));
        continue;
      }
      if (begin > gap) out->push_back(Span{piece.begin + gap, piece.begin + begin});
      out->push_back(Span{piece.begin + begin, piece.begin + end});
      gap = start = end;
    }
    if (gap < length) out->push_back(Span{piece.begin + gap, piece.end});
  }
  pcre2_match_data_free(match);
}

}  // namespace heavykv
