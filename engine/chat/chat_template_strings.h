// Python's str methods on UTF-8 strings, for the chat-template interpreter's builtins
// (engine/chat/chat_template_builtins.h). Case mapping covers ASCII letters only; other characters
// pass through unchanged.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace heavykv::jinja {

// str.strip / lstrip / rstrip: `chars` null strips whitespace (str.isspace).
std::string PyStrip(const std::string& s, const std::string* chars, bool left, bool right);
// str.split(sep, maxsplit): sep null splits on whitespace runs; maxsplit < 0 is unlimited.
std::vector<std::string> PySplit(const std::string& s, const std::string* sep, int64_t maxsplit);
// str.replace(old, new, count): count < 0 replaces all.
std::string PyReplace(const std::string& s, const std::string& from, const std::string& to,
                      int64_t count);
std::string PyUpper(std::string s);
std::string PyLower(std::string s);
std::string PyCapitalize(const std::string& s);
// str.title(): a letter after a non-letter upper-cased, others lower-cased.
std::string PyTitle(const std::string& s);
// jinja2's `title` filter: each word, split at runs of whitespace and -({[<, capitalized.
std::string JinjaTitle(const std::string& s);
// str.splitlines() (keepends=False).
std::vector<std::string> PySplitLines(const std::string& s);
// str.find: the code point index of `sub`, or -1.
int64_t PyFind(const std::string& s, const std::string& sub);

}  // namespace heavykv::jinja
