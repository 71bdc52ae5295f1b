// Grammar: the one form every constraint compiles to (docs/ARCHITECTURE.md "Structured
// outputs"): a context-free grammar over BYTES. JSON Schema (json_schema.h), regular expressions
// (regex.h), choice lists and llama.cpp's GBNF (gbnf.h) are all lowered through GrammarBuilder;
// the automaton (automaton.h) matches bytes against it and computes token masks.
//
//   GrammarBuilder b;
//   Expr digit = b.Bytes(ByteSet::Range('0', '9'));
//   RuleId root = b.DeclareRule("root");
//   b.DefineRule(root, b.Seq({b.Literal("n="), b.Repeat(digit, 1, -1)}));
//   absl::StatusOr<Grammar> g = std::move(b).Build(root);
//
// Text is bytes: a code point outside ASCII is its UTF-8 sequence (Utf8Ranges lowers a class of
// code points to byte alternatives), so a token that ends inside a character is matched byte by
// byte like any other. Repetition, options and alternatives become rules when built; a rule
// that refers to itself as its last element loops without growing the matcher's stack.
// Left recursion (a rule reachable from itself before any byte is consumed) is an error.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace heavykv::grammar {

// A set of bytes (one terminal).
struct ByteSet {
  std::array<uint64_t, 4> bits{};

  static ByteSet Of(uint8_t b) {
    ByteSet s;
    s.Add(b);
    return s;
  }
  static ByteSet Range(uint8_t lo, uint8_t hi) {
    ByteSet s;
    s.AddRange(lo, hi);
    return s;
  }
  static ByteSet All() { return Range(0, 255); }
  void Add(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
  void AddRange(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) Add(static_cast<uint8_t>(b));
  }
  bool Has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  bool Empty() const { return (bits[0] | bits[1] | bits[2] | bits[3]) == 0; }
  int Count() const;
  ByteSet operator|(const ByteSet& o) const;
  ByteSet operator&(const ByteSet& o) const;
  ByteSet operator~() const;
  bool operator==(const ByteSet& o) const = default;
  bool Contains(const ByteSet& o) const { return (o & ~*this).Empty(); }
};

using RuleId = int32_t;

// One element of an alternative: a byte from a set, or a whole rule.
struct Element {
  enum class Kind : uint8_t { kBytes, kRule };
  Kind kind = Kind::kBytes;
  int32_t index = 0;  // kBytes: into Grammar::byte_sets; kRule: a RuleId
};

// The built grammar: immutable, shared by every matcher of it.
struct Grammar {
  std::vector<ByteSet> byte_sets;
  std::vector<std::string> rule_names;
  // rules[r] = its alternatives; each is a sequence of elements (empty: matches nothing).
  std::vector<std::vector<std::vector<Element>>> rules;
  RuleId root = 0;

  int64_t NumElements() const;
  // GBNF-like text, for errors and `heavykv grammar --print`.
  std::string ToString() const;
};

// Limits on what a compile may build: a schema or grammar past them is refused with
// RESOURCE_EXHAUSTED naming the limit. Compilers poll Expired() in their loops.
struct GrammarLimits {
  int64_t max_elements = 2'000'000;  // elements of all rules after lowering
  int32_t max_repeat = 10'000;       // the largest bounded count {m,n} written out
  int32_t max_depth = 64;            // nesting the compilers recurse through ($ref, groups)
};

// Builds a Grammar from expressions, bottom up. An Expr is a handle into this builder only.
class GrammarBuilder {
 public:
  using Expr = int32_t;

  explicit GrammarBuilder(GrammarLimits limits = {}) : limits_(limits) {}
  const GrammarLimits& limits() const { return limits_; }

  Expr Empty();                           // matches ""
  Expr Nothing();                         // matches no string at all
  Expr Bytes(const ByteSet& set);         // one byte of the set (an empty set: Nothing)
  Expr Literal(std::string_view bytes);   // these bytes in order
  // One code point in the union of [lo, hi] ranges (inclusive, within 0..0x10FFFF, surrogates
  // excluded), as its UTF-8 bytes; `negate`: one code point in none of them.
  Expr CodePoints(std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negate = false);
  Expr Seq(std::vector<Expr> items);
  Expr Alt(std::vector<Expr> items);
  // `e` repeated min..max times (max -1: unbounded). Past GrammarLimits::max_repeat the Build
  // fails; counts are written out as nested options, so keep them small.
  Expr Repeat(Expr e, int32_t min, int32_t max);
  Expr Optional(Expr e) { return Repeat(e, 0, 1); }
  Expr Ref(RuleId rule);

  // Rules by name, for recursion ($ref, GBNF): declare, refer to, then define once.
  RuleId DeclareRule(std::string name);
  void DefineRule(RuleId rule, Expr body);
  bool IsDefined(RuleId rule) const;

  // Lowers every rule reachable from `root` to Grammar form. INVALID_ARGUMENT for a rule that
  // was referred to but never defined (naming it) or for left recursion; RESOURCE_EXHAUSTED past
  // the limits.
  absl::StatusOr<Grammar> Build(RuleId root) &&;

  // The status the first over-limit call recorded (builders keep going; Build returns it).
  const absl::Status& status() const { return status_; }

 private:
  struct Node {
    enum class Op : uint8_t { kEmpty, kNothing, kBytes, kSeq, kAlt, kRepeat, kRef };
    Op op = Op::kEmpty;
    ByteSet set;               // kBytes
    std::vector<Expr> items;   // kSeq, kAlt, kRepeat (one)
    int32_t min = 0, max = 0;  // kRepeat
    RuleId rule = -1;          // kRef
  };
  static Node MakeNode(Node::Op op) {
    Node n;
    n.op = op;
    return n;
  }
  Expr Add(Node n);
  void Fail(absl::Status s);

  GrammarLimits limits_;
  std::vector<Node> nodes_;
  std::vector<std::string> rule_names_;
  std::vector<Expr> rule_bodies_;  // -1 until defined
  absl::Status status_;
  friend class Lowering;
};

// Whether `g` matches all of `text` (a reference matcher for tests: the automaton's byte steps).
bool Matches(const Grammar& g, std::string_view text);

}  // namespace heavykv::grammar
