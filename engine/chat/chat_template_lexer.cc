// jinja2's lexer (jinja2/lexer.py's rules) for the default delimiters, with trim_blocks=True and
// lstrip_blocks=True as Hugging Face's chat templates are compiled.
#include "engine/chat/chat_template_lexer.h"

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace heavykv::jinja {
namespace {

// Newlines as jinja2 normalizes them (\r\n and \r become \n; keep_trailing_newline=False drops
// one final \n).
std::string Normalize(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      out += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      out += source[k];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// The length of the Python whitespace (str.isspace, as re's \s) that starts at `pos`.
size_t SpaceRun(const std::string& s, size_t pos) {
  size_t k = pos;
  while (k < s.size()) {
    const auto c = static_cast<uint8_t>(s[k]);
    if (c < 0x80) {
      if (!IsPySpace(c)) break;
      ++k;
      continue;
    }
    size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
    if (k + len > s.size()) break;
    std::vector<uint32_t> cp = DecodeUtf8(s.substr(k, len));
    if (cp.size() != 1 || !IsPySpace(cp[0])) break;
    k += len;
  }
  return k - pos;
}

// `text` without its trailing Python whitespace.
std::string RStrip(const std::string& text) {
  std::vector<uint32_t> cps = DecodeUtf8(text);
  size_t end = cps.size();
  while (end > 0 && IsPySpace(cps[end - 1])) --end;
  return EncodeUtf8(cps, 0, end);
}

bool AllSpace(const std::string& s, size_t from) {
  return from < s.size() && SpaceRun(s, from) == s.size() - from;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) : src_(Normalize(source)) {
    line_starts_.push_back(0);
    for (size_t k = 0; k < src_.size(); ++k) {
      if (src_[k] == '\n') line_starts_.push_back(k + 1);
    }
  }

  absl::StatusOr<std::vector<Token>> Run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t tag = src_.find('{', pos_);
      while (tag != std::string::npos && tag + 1 < src_.size() && src_[tag + 1] != '{' &&
             src_[tag + 1] != '%' && src_[tag + 1] != '#') {
        tag = src_.find('{', tag + 1);
      }
      if (tag == std::string::npos || tag + 1 >= src_.size()) {
        Emit(Token::Kind::kText, src_.substr(pos_), pos_);
        break;
      }
      const char type = src_[tag + 1];
      char sign = tag + 2 < src_.size() ? src_[tag + 2] : 0;
      if (sign != '-' && sign != '+') sign = 0;
      std::string text = src_.substr(pos_, tag - pos_);
      if (sign == '-') {
        text = RStrip(text);
      } else if (sign == 0 && type != '{') {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && AllSpace(text, l_pos)) text.resize(l_pos);
      }
      if (!text.empty()) Emit(Token::Kind::kText, text, pos_);
      pos_ = tag + 2 + (sign ? 1 : 0);
      absl::Status s;
      if (type == '#') {
        s = Comment(tag);
      } else {
        s = Tag(type == '{', tag);
      }
      if (!s.ok()) return s;
      line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
    }
    Emit(Token::Kind::kEof, "", src_.size());
    return std::move(tokens_);
  }

 private:
  void Emit(Token::Kind kind, std::string text, size_t offset) {
    Token t;
    t.kind = kind;
    t.text = std::move(text);
    Where(offset, &t.line, &t.column);
    tokens_.push_back(std::move(t));
  }

  void Where(size_t offset, int* line, int* column) const {
    size_t lo = 0;
    size_t hi = line_starts_.size();
    while (hi - lo > 1) {
      const size_t mid = (lo + hi) / 2;
      if (line_starts_[mid] <= offset) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    *line = static_cast<int>(lo + 1);
    *column = static_cast<int>(offset - line_starts_[lo] + 1);
  }

  absl::Status Error(size_t offset, const std::string& what) const {
    int line, column;
    Where(offset, &line, &column);
    return absl::InvalidArgumentError(
        absl::StrCat("chat template line ", line, ", column ", column, ": ", what));
  }

  // After a `%}` / `#}`: `-` eats all following whitespace, `+` nothing, plain one newline
  // (trim_blocks).
  void AfterBlockEnd(char sign) {
    if (sign == '-') {
      pos_ += SpaceRun(src_, pos_);
    } else if (sign == 0 && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
  }

  absl::Status Comment(size_t start) {
    for (size_t k = pos_; k + 1 < src_.size(); ++k) {
      if (src_[k] == '#' && src_[k + 1] == '}') {
        const char sign = k > pos_ && (src_[k - 1] == '-' || src_[k - 1] == '+') ? src_[k - 1] : 0;
        pos_ = k + 2;
        AfterBlockEnd(sign);
        return absl::OkStatus();
      }
    }
    return Error(start, "missing end of comment tag");
  }

  absl::Status Tag(bool variable, size_t start) {
    Emit(variable ? Token::Kind::kVarBegin : Token::Kind::kBlockBegin, "", start);
    int balance = 0;
    while (true) {
      pos_ += SpaceRun(src_, pos_);
      if (pos_ >= src_.size()) {
        return Error(start, variable ? "unexpected end of template, expected '}}'"
                                     : "unexpected end of template, expected '%}'");
      }
      const char c = src_[pos_];
      const char c1 = pos_ + 1 < src_.size() ? src_[pos_ + 1] : 0;
      const char c2 = pos_ + 2 < src_.size() ? src_[pos_ + 2] : 0;
      if (balance == 0) {
        const char close = variable ? '}' : '%';
        if ((c == '-' || (c == '+' && !variable)) && c1 == close && c2 == '}') {
          Emit(variable ? Token::Kind::kVarEnd : Token::Kind::kBlockEnd, "", pos_);
          pos_ += 3;
          if (variable) {
            pos_ += SpaceRun(src_, pos_);
          } else {
            AfterBlockEnd(c);
          }
          return absl::OkStatus();
        }
        if (c == close && c1 == '}') {
          Emit(variable ? Token::Kind::kVarEnd : Token::Kind::kBlockEnd, "", pos_);
          pos_ += 2;
          if (!variable) AfterBlockEnd(0);
          return absl::OkStatus();
        }
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t end = pos_;
        while (end < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) {
          ++end;
        }
        Emit(Token::Kind::kName, src_.substr(pos_, end - pos_), pos_);
        pos_ = end;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        if (auto s = Number(); !s.ok()) return s;
      } else if (c == '\'' || c == '"') {
        if (auto s = String(); !s.ok()) return s;
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                           "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                           ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};
        bool found = false;
        for (const char* op : kOps) {
          const std::string_view o(op);
          if (src_.compare(pos_, o.size(), o) == 0) {
            if (o == "(" || o == "[" || o == "{") ++balance;
            if (o == ")" || o == "]" || o == "}") {
              if (balance == 0) return Error(pos_, absl::StrCat("unexpected '", op, "'"));
              --balance;
            }
            Emit(Token::Kind::kOp, std::string(o), pos_);
            pos_ += o.size();
            found = true;
            break;
          }
        }
        if (!found) return Error(pos_, absl::StrCat("unexpected char '", std::string(1, c), "'"));
      }
    }
  }

  absl::Status Number() {
    const size_t start = pos_;
    std::string digits;
    bool is_float = false;
    auto take_digits = [&] {
      while (pos_ < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[pos_])) ||
                                    (src_[pos_] == '_' && pos_ + 1 < src_.size() &&
                                     std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))))) {
        if (src_[pos_] != '_') digits += src_[pos_];
        ++pos_;
      }
    };
    take_digits();
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
      is_float = true;
      digits += '.';
      ++pos_;
      take_digits();
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t k = pos_ + 1;
      if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (k < src_.size() && std::isdigit(static_cast<unsigned char>(src_[k]))) {
        is_float = true;
        digits += src_.substr(pos_, k - pos_);
        pos_ = k;
        take_digits();
      }
    }
    Token t;
    t.kind = Token::Kind::kLiteral;
    Where(start, &t.line, &t.column);
    if (is_float) {
      t.literal = Value::Float(std::strtod(digits.c_str(), nullptr));
    } else {
      errno = 0;
      const long long v = std::strtoll(digits.c_str(), nullptr, 10);
      if (errno == ERANGE) return Error(start, "integer literal out of range");
      t.literal = Value::Int(v);
    }
    tokens_.push_back(std::move(t));
    return absl::OkStatus();
  }

  // A quoted string with Python's escapes (jinja2 decodes them with "unicode-escape").
  absl::Status String() {
    const size_t start = pos_;
    const char quote = src_[pos_++];
    std::string out;
    while (true) {
      if (pos_ >= src_.size()) return Error(start, "unterminated string");
      const char c = src_[pos_++];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= src_.size()) return Error(start, "unterminated string");
      const char e = src_[pos_++];
      auto hex = [&](int n) -> int64_t {
        if (pos_ + static_cast<size_t>(n) > src_.size()) return -1;
        int64_t v = 0;
        for (int k = 0; k < n; ++k) {
          const char h = src_[pos_ + static_cast<size_t>(k)];
          if (!std::isxdigit(static_cast<unsigned char>(h))) return -1;
          v = v * 16 + (std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                                                                    : (std::tolower(h) - 'a' + 10));
        }
        pos_ += static_cast<size_t>(n);
        return v;
      };
      switch (e) {
        case '\n':
          break;
        case '\\':
        case '\'':
        case '"':
          out += e;
          break;
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case 'x':
        case 'u':
        case 'U': {
          const int64_t v = hex(e == 'x' ? 2 : e == 'u' ? 4 : 8);
          if (v < 0 || v > 0x10FFFF) return Error(pos_, "invalid escape in string");
          AppendUtf8(static_cast<uint32_t>(v), &out);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '7';
                 ++k) {
              v = v * 8 + static_cast<uint32_t>(src_[pos_++] - '0');
            }
            AppendUtf8(v, &out);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    Token t;
    t.kind = Token::Kind::kLiteral;
    t.literal = Value::String(std::move(out));
    Where(start, &t.line, &t.column);
    tokens_.push_back(std::move(t));
    return absl::OkStatus();
  }

  std::string src_;
  size_t pos_ = 0;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

absl::StatusOr<std::vector<Token>> LexTemplate(std::string_view source) {
  return Lexer(source).Run();
}

}  // namespace heavykv::jinja
