// engine/chat/chat_template.h against jinja2: the renderings in tests/data/gguf/chat.jsonl and
// tests/data/chat_templates/expected.jsonl (written by tests/chat/render_reference.py
// with jinja2 as Hugging Face transformers configures it) byte for byte, the expression language
// and whitespace control case by case, and hostile templates refused quickly.
#include "engine/chat/chat_template.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "engine/gguf/gguf.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace heavykv {
namespace {

using ::heavykv::testing::SourcePath;
using ::heavykv::testing::TempDir;

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<nlohmann::json> JsonLines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

std::vector<ChatMessage> Messages(const nlohmann::json& j) {
  std::vector<ChatMessage> out;
  for (const auto& m : j) out.push_back({m["role"], m["content"]});
  return out;
}

// render_reference.py's strftime_now time.
absl::Time ReferenceNow() {
  return absl::FromCivil(absl::CivilSecond(2026, 12, 4, 15, 30, 0), absl::UTCTimeZone());
}

absl::StatusOr<std::string> Render(const std::string& source,
                                   const std::vector<ChatMessage>& messages = {},
                                   ChatRenderOptions opts = {}) {
  auto t = ChatTemplate::Parse(source, opts.limits);
  if (!t.ok()) return t.status();
  if (!opts.now) opts.now = ReferenceNow();
  return t->Render(messages, opts);
}

std::string Ok(const std::string& source, const std::vector<ChatMessage>& messages = {},
               ChatRenderOptions opts = {}) {
  auto r = Render(source, messages, opts);
  EXPECT_TRUE(r.ok()) << source << ": " << r.status();
  return r.ok() ? *r : "<error>";
}

TEST(ChatTemplateTest, GgufTemplatesReproduceChatJsonl) {
  const auto lines = JsonLines(SourcePath("tests/data/gguf/chat.jsonl"));
  ASSERT_EQ(lines.size(), 2u);
  for (const auto& j : lines) {
    const std::string name = j["template"];
    const std::string source = ReadText(SourcePath("tests/data/chat_templates/" + name + ".jinja"));
    ChatRenderOptions opts;
    opts.bos_token = name == "llama3" ? "<|begin_of_text|>" : "";
    opts.eos_token = name == "llama3" ? "<|eot_id|>" : "<|im_end|>";
    EXPECT_EQ(Ok(source, Messages(j["messages"]), opts), j["rendered"].template get<std::string>())
        << name;
  }
}

// The .jinja copies are the GGUF files' own templates, byte for byte.
TEST(ChatTemplateTest, TemplateFilesMatchTheGgufMetadata) {
  for (const auto& [gguf, name] :
       {std::pair<std::string, std::string>{"llama3-vocab.gguf", "llama3"},
        {"qwen-vocab.gguf", "qwen3"}}) {
    const std::string path = SourcePath("../shared/gguf/" + gguf);
    if (!std::ifstream(path)) GTEST_SKIP() << path << " is not present";
    auto file = GgufFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    auto tmpl = file->GetString("tokenizer.chat_template");
    ASSERT_TRUE(tmpl.ok()) << tmpl.status();
    EXPECT_EQ(std::string(*tmpl),
              ReadText(SourcePath("tests/data/chat_templates/" + name + ".jinja")));
  }
}

TEST(ChatTemplateTest, EveryTemplateMatchesJinja2) {
  const auto lines = JsonLines(SourcePath("tests/data/chat_templates/expected.jsonl"));
  ASSERT_GE(lines.size(), 300u);
  std::map<std::string, std::optional<ChatTemplate>> parsed;
  int rendered = 0, raised = 0, errors = 0;
  for (const auto& j : lines) {
    if (j.contains("snippet")) continue;  // ExpressionSnippetsMatchJinja2
    const std::string name = j["template"];
    if (!parsed.count(name)) {
      auto t =
          ChatTemplate::Parse(ReadText(SourcePath("tests/data/chat_templates/" + name + ".jinja")));
      ASSERT_TRUE(t.ok()) << name << ": " << t.status();
      parsed.emplace(name, std::move(*t));
    }
    ChatRenderOptions opts;
    opts.bos_token = j["bos_token"];
    opts.eos_token = j["eos_token"];
    opts.add_generation_prompt = j["add_generation_prompt"];
    opts.now = ReferenceNow();
    if (j.contains("extra")) {
      for (const auto& [k, v] : j["extra"].items()) {
        if (v.is_boolean()) {
          opts.extra_bools[k] = v.template get<bool>();
        } else {
          opts.extra_strings[k] = v.template get<std::string>();
        }
      }
    }
    auto out = parsed.at(name)->Render(Messages(j["messages"]), opts);
    const std::string where = name + " conversation " + j["conversation"].dump() +
                              " add_generation_prompt=" + j["add_generation_prompt"].dump() +
                              (j.contains("extra") ? " extra " + j["extra"].dump() : "");
    if (j.contains("rendered")) {
      ++rendered;
      ASSERT_TRUE(out.ok()) << where << ": " << out.status();
      EXPECT_EQ(*out, j["rendered"].template get<std::string>()) << where;
    } else if (j.contains("raised")) {
      ++raised;
      ASSERT_FALSE(out.ok()) << where;
      EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << where;
      EXPECT_EQ(out.status().message(), j["raised"].template get<std::string>()) << where;
    } else {
      ++errors;
      EXPECT_FALSE(out.ok()) << where << " renders, jinja2 fails with " << j["error"];
    }
  }
  EXPECT_GT(rendered, 250);
  EXPECT_GT(raised, 10);
  EXPECT_GT(errors, 0);
}

// An OpenAI request's message as the server reads it (server/http/openai_json.cc does the same).
ChatMessage ApiMessage(const nlohmann::json& m) {
  ChatMessage out;
  out.role = m["role"];
  if (m["content"].is_null()) {
    out.content_null = true;
  } else {
    out.content = m["content"];
  }
  if (m.contains("tool_calls")) {
    for (const auto& c : m["tool_calls"]) {
      out.tool_calls.push_back({c["id"], c["type"], c["function"]["name"],
                                c["function"]["arguments"]});
    }
  }
  if (m.contains("tool_call_id")) out.tool_call_id = m["tool_call_id"];
  if (m.contains("name")) out.name = m["name"];
  if (m.contains("reasoning_content")) out.reasoning_content = m["reasoning_content"];
  return out;
}

// Tool-calling conversations (tools, assistant tool_calls with null content, tool messages,
// reasoning_content) and chat_template_kwargs of any JSON type, as jinja2 renders them with the
// messages vLLM prepares (tools_expected.jsonl). The JSON is parsed again from its text with
// the keys in the file's order, as the server keeps them.
TEST(ChatTemplateTest, ToolConversationsMatchJinja2) {
  std::ifstream in(SourcePath("tests/data/chat_templates/tools_expected.jsonl"));
  std::string line;
  std::map<std::string, std::optional<ChatTemplate>> parsed;
  int rendered = 0, raised = 0, with_tools = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::ordered_json::parse(line);
    const std::string name = j["template"];
    if (!parsed.count(name)) {
      auto t =
          ChatTemplate::Parse(ReadText(SourcePath("tests/data/chat_templates/" + name + ".jinja")));
      ASSERT_TRUE(t.ok()) << name << ": " << t.status();
      parsed.emplace(name, std::move(*t));
    }
    ChatRenderOptions opts;
    opts.bos_token = j["bos_token"];
    opts.eos_token = j["eos_token"];
    opts.add_generation_prompt = j["add_generation_prompt"];
    opts.now = ReferenceNow();
    opts.tools_json = j["tools"].dump();
    if (j.contains("extra")) opts.extra_json = j["extra"].dump();
    std::vector<ChatMessage> messages;
    for (const auto& m : j["messages"]) messages.push_back(ApiMessage(nlohmann::json::parse(m.dump())));
    auto out = parsed.at(name)->Render(messages, opts);
    const std::string where = name + " conversation " + j["conversation"].dump() +
                              " add_generation_prompt=" + j["add_generation_prompt"].dump() +
                              (j.contains("extra") ? " extra " + j["extra"].dump() : "");
    if (j.contains("rendered")) {
      ++rendered;
      ASSERT_TRUE(out.ok()) << where << ": " << out.status();
      EXPECT_EQ(*out, j["rendered"].template get<std::string>()) << where;
      with_tools += out->find("get_weather") != std::string::npos;
    } else if (j.contains("raised")) {
      ++raised;
      ASSERT_FALSE(out.ok()) << where;
      EXPECT_EQ(out.status().message(), j["raised"].template get<std::string>()) << where;
    } else {
      EXPECT_FALSE(out.ok()) << where << " renders, jinja2 fails with " << j["error"];
    }
  }
  EXPECT_GT(rendered, 80);
  EXPECT_GT(raised, 10);
  EXPECT_GT(with_tools, 40);
}

TEST(ChatTemplateTest, BadJsonVariablesAreInvalidArgument) {
  const std::string source = "{{ tools | tojson }}{{ x }}";
  ChatRenderOptions opts;
  opts.tools_json = "[{\"a\": 1}";
  EXPECT_EQ(Render(source, {}, opts).status().code(), absl::StatusCode::kInvalidArgument);
  opts.tools_json = "{}";
  EXPECT_EQ(Render(source, {}, opts).status().code(), absl::StatusCode::kInvalidArgument);
  opts.tools_json = "[{\"b\": 2, \"a\": [1.0, null, true]}]";
  opts.extra_json = "{\"x\": {\"y\": 3}, \"tools\": 5}";
  EXPECT_EQ(Ok(source, {}, opts), "[{\"b\": 2, \"a\": [1.0, null, true]}]{'y': 3}");
  ChatMessage call{"assistant", ""};
  call.tool_calls.push_back({"id", "function", "f", "[1]"});
  auto r = Render("{{ messages }}", {call}, {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("messages[0].tool_calls[0].function.arguments"),
            std::string::npos);
}

// One-line templates of the expression language (tests/data/chat_templates/snippets.txt), each
// rendered by jinja2 into expected.jsonl.
TEST(ChatTemplateTest, ExpressionSnippetsMatchJinja2) {
  int n = 0;
  for (const auto& j : JsonLines(SourcePath("tests/data/chat_templates/expected.jsonl"))) {
    if (!j.contains("snippet")) continue;
    ++n;
    const std::string snippet = j["snippet"];
    auto out = Render(snippet, Messages(j["messages"]));
    if (j.contains("rendered")) {
      ASSERT_TRUE(out.ok()) << snippet << ": " << out.status();
      EXPECT_EQ(*out, j["rendered"].template get<std::string>()) << snippet;
    } else {
      EXPECT_FALSE(out.ok()) << snippet << " renders, jinja2 fails with " << j["error"];
    }
  }
  EXPECT_GE(n, 25);
}

// Whitespace control: trim_blocks, lstrip_blocks and the '-'/'+' markers as jinja2 applies them
// (each expectation checked against jinja2 3.1 with trim_blocks/lstrip_blocks).
TEST(ChatTemplateTest, WhitespaceControl) {
  EXPECT_EQ(Ok("a\n{% if true %}\nb\n{% endif %}\nc"), "a\nb\nc");
  EXPECT_EQ(Ok("a\n    {% if true %}\n  b\n    {% endif %}\nc"), "a\n  b\nc");
  EXPECT_EQ(Ok("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(Ok("a\n  {{ 'x' }}\n"), "a\n  x");  // no lstrip for {{ }}; one trailing \n dropped
  EXPECT_EQ(Ok("a \n {{- 'x' -}} \n b"), "axb");
  EXPECT_EQ(Ok("  {%+ if true %}x{% endif %}"), "  x");
  EXPECT_EQ(Ok("{% if true +%}\nx{% endif %}"), "\nx");
  EXPECT_EQ(Ok("a {# comment #}\nb"), "a b");
  EXPECT_EQ(Ok("a\n  {# comment #}\nb"), "a\nb");
  EXPECT_EQ(Ok("x\r\ny\rz\n\n"), "x\ny\nz\n");
  EXPECT_EQ(Ok("  {% if true %}x{% endif %}"), "x");  // lstrip at the template's start
  EXPECT_EQ(Ok("{{ 'a' }}  {% if true %}x{% endif %}"), "a  x");
}

TEST(ChatTemplateTest, Expressions) {
  EXPECT_EQ(Ok("{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }}"),
            "7 3 -4 2 3.5 1024");
  EXPECT_EQ(Ok("{{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.0 }} {{ 3 / 1 }} {{ 1e-5 }}"),
            "0.30000000000000004 1e+20 1.0 3.0 1e-05");
  EXPECT_EQ(Ok("{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 3 }}"), "a1NoneTrue ababab");
  EXPECT_EQ(Ok("{{ [1, 'a', none, true, 1.5] }} {{ {'k': 'v', 'n': [1]} }} {{ (1,) }}"),
            "[1, 'a', None, True, 1.5] {'k': 'v', 'n': [1]} (1,)");
  EXPECT_EQ(Ok("{{ \"it's\" }} {{ ['it\\'s', \"q\\\"\"] }}"), "it's [\"it's\", 'q\"']");
  EXPECT_EQ(Ok("{{ 'a\\tb\\u00e9\\x41\\n' }}"), "a\tbéA\n");
  EXPECT_EQ(Ok("{{ 'abcdef'[1:3] }} {{ 'abcdef'[::-1] }} {{ 'abcdef'[-2:] }} {{ [1,2,3][1:] }}"),
            "bc fedcba ef [2, 3]");
  EXPECT_EQ(Ok("{{ 'héllo'[1] }} {{ 'héllo'|length }} {{ 'héllo'[:-1] }}"), "é 5 héll");
  EXPECT_EQ(Ok("{{ 1 < 2 < 3 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' in 'cat' }} "
               "{{ 2 not in [1, 3] }} {{ 'k' in {'k': 1} }}"),
            "True True True True True True");
  EXPECT_EQ(Ok("{{ none or 'x' }} {{ 0 and 1 }} {{ not [] }} {{ 'y' if 0 else 'n' }}"),
            "x 0 True n");
  EXPECT_EQ(Ok("[{{ 'y' if false }}]"), "[]");
  EXPECT_EQ(Ok("{{ 'a' 'b' }}"), "ab");
}

TEST(ChatTemplateTest, VariablesAndUndefined) {
  EXPECT_EQ(Ok("[{{ nope }}][{{ nope is defined }}][{{ nope|length }}][{{ nope|default('d') }}]"),
            "[][False][0][d]");
  EXPECT_EQ(Ok("{% for m in messages %}{{ m.role }}:{{ m['content'] }}|{{ m.missing }}|"
               "{{ m.missing is undefined }}{% endfor %}",
               {{"user", "hi"}}),
            "user:hi||True");
  EXPECT_FALSE(Render("{{ nope.attr }}").ok());
  EXPECT_FALSE(Render("{{ nope() }}").ok());
  EXPECT_FALSE(Render("{{ nope + 1 }}").ok());
  EXPECT_FALSE(Render("{{ 1 + 'a' }}").ok());
  EXPECT_EQ(Ok("{{ none.x }}|{{ 'abc'.x }}"), "|");
  ChatRenderOptions opts;
  opts.extra_bools["enable_thinking"] = false;
  opts.extra_strings["name"] = "Bob";
  EXPECT_EQ(Ok("{{ enable_thinking is false }} {{ name }} {{ tools is none }}", {}, opts),
            "True Bob True");
}

TEST(ChatTemplateTest, Statements) {
  EXPECT_EQ(Ok("{% for x in [1, 2, 3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
               "{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}"),
            "103TrueFalse3;212FalseFalse3;321FalseTrue3;");
  EXPECT_EQ(Ok("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}"),
            "2242");
  EXPECT_EQ(Ok("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(Ok("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }},{% endfor %}"),
            "a=1,b=2,");
  EXPECT_EQ(Ok("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}"
               "{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "013");
  EXPECT_EQ(Ok("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(Ok("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}"
               "{% endfor %}{{ ns.n }}"),
            "6");
  EXPECT_EQ(Ok("{% if false %}a{% elif 1 %}b{% else %}c{% endif %}"), "b");
  EXPECT_EQ(Ok("{% set a, b = [1, 2] %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(Ok("{% set block %}x{{ 1 + 1 }}{% endset %}[{{ block }}]"), "[x2]");
  // A namespace holding itself: a cycle the render breaks when it ends (LeakSanitizer checks),
  // printed with "..." past 64 levels.
  auto cycle =
      Render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns.me.me is defined }}{{ ns }}");
  ASSERT_TRUE(cycle.ok()) << cycle.status();
  EXPECT_EQ(cycle->substr(0, 30), "True<Namespace {'me': <Namespa");
  EXPECT_NE(cycle->find("..."), std::string::npos);
}

TEST(ChatTemplateTest, FiltersAndMethods) {
  EXPECT_EQ(Ok("{{ '  hi  '|trim }}|{{ 'Hi'|upper }}{{ 'Hi'|lower }}|{{ 'hello world-x'|title }}"
               "|{{ 'hELLO'|capitalize }}|{{ 'aXa'|replace('a', 'b') }}|{{ [1, 2]|join(', ') }}"),
            "hi|HIhi|Hello World-X|Hello|bXb|1, 2");
  EXPECT_EQ(Ok("{{ [3, 1]|first }}{{ [3, 1]|last }}{{ 'abc'|list }}{{ {'a': 1}|items|list }}"),
            "31['a', 'b', 'c'][('a', 1)]");
  EXPECT_EQ(Ok("{{ {'a': 'é\"\\n', 'b': [1, 2.5, none, true]}|tojson }}"),
            "{\"a\": \"é\\\"\\n\", \"b\": [1, 2.5, null, true]}");
  EXPECT_EQ(Ok("{{ {'a': [1], 'b': {}}|tojson(indent=2) }}"),
            "{\n  \"a\": [\n    1\n  ],\n  \"b\": {}\n}");
  EXPECT_EQ(Ok("{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }}",
               {{"user", "a"}, {"assistant", "b"}, {"user", "c"}}),
            "['a', 'c']");
  EXPECT_EQ(Ok("{{ messages|rejectattr('role', 'equalto', 'user')|list|length }}",
               {{"user", "a"}, {"assistant", "b"}}),
            "1");
  EXPECT_EQ(Ok("{{ 'a\\nb'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}"), "a\n  b|  a\n  b");
  EXPECT_EQ(Ok("{{ '42'|int + 1 }} {{ 'x'|int }} {{ 2.5|round }} {{ 3.14159|round(2) }}"),
            "43 0 2.0 3.14");
  EXPECT_EQ(
      Ok("{{ ' a b '.strip() }}|{{ 'xxhixx'.lstrip('x') }}|{{ 'a,b,,c'.split(',') }}"
         "|{{ ' a  b '.split() }}|{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}"),
      "a b|hixx|['a', 'b', '', 'c']|['a', 'b']|TrueTrue");
  EXPECT_EQ(Ok("{{ {'a': 1}.get('a') }}{{ {'a': 1}.get('b', 2) }}{{ {'a': 1}.get('b') }}"
               "{{ {'a': 1}.keys()|list }}{{ {'a': 1}.values()|list }}"),
            "12None['a'][1]");
  EXPECT_EQ(Ok("{{ 'user'.title() }} {{ 'hello world'.title() }}"), "User Hello World");
  EXPECT_EQ(Ok("{{ x is string }}{{ 'a' is string }}{{ {} is mapping }}{{ [] is iterable }}"
               "{{ 1 is number }}{{ [] is sequence }}{{ none is none }}{{ 3 is odd }}"),
            "FalseTrueTrueTrueTrueTrueTrueTrue");
  EXPECT_EQ(Ok("{{ strftime_now('%d %b %Y') }}"), "04 Dec 2026");
}

TEST(ChatTemplateTest, RaiseExceptionIsTheMessage) {
  auto r = Render("{{ raise_exception('Roles must alternate') }}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "Roles must alternate");
}

TEST(ChatTemplateTest, SyntaxErrorsNameLineAndColumn) {
  for (const char* bad : {"{% if x %}", "{{ 1 + }}", "{% for %}", "{{ 'abc }}", "{# open",
                          "a\n{% endfor %}", "{% call m() %}{% endcall %}", "{{ (1 }}",
                          "{% include 'x' %}", "{{ x | }}", "{% break %}"}) {
    auto t = ChatTemplate::Parse(bad);
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(t.status().message().find("line "), std::string::npos) << t.status();
  }
  auto t = ChatTemplate::Parse("ok\n\n  {{ 1 + }}");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("line 3, column"), std::string::npos) << t.status();
}

// Hostile templates end with a clear error (the bounds, not the machine, stop them; their cost is
// in tests/fuzz/chat_template_fuzzer.cc's timeout, not a timed test).
TEST(ChatTemplateTest, HostileTemplatesAreBounded) {
  for (const char* bad :
       {"{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
        "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}",
        "{{ 'x' * 1000000000 }}",
        "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(100) %}"
        "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        "{% set ns = namespace(l=[1]) %}{% for i in range(100) %}{% set ns.l = ns.l + ns.l %}"
        "{% endfor %}",
        "{{ range(1000000) }}", "{{ 'a'.replace('', 'xxxxxxxxxx') * 1000000 }}",
        "{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}",
        "{% macro m(s) %}{{ m(s ~ s) }}{% endmacro %}{{ m('x') }}"}) {
    auto r = Render(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_TRUE(r.status().code() == absl::StatusCode::kResourceExhausted ||
                r.status().code() == absl::StatusCode::kInvalidArgument)
        << r.status();
  }
  std::string deep;
  for (int i = 0; i < 5000; ++i) deep += "(";
  EXPECT_FALSE(ChatTemplate::Parse("{{ " + deep + " }}").ok());
  std::string nested;
  for (int i = 0; i < 1000; ++i) nested += "{% if true %}";
  EXPECT_FALSE(ChatTemplate::Parse(nested).ok());
  std::string neg = "{{ ";
  for (int i = 0; i < 100000; ++i) neg += "-";
  EXPECT_FALSE(ChatTemplate::Parse(neg + "1 }}").ok());
}

// The bounds leave room for real conversations: 2000 messages of 1 KB each (2 MB of prompt).
TEST(ChatTemplateTest, LongConversationsFitTheBounds) {
  std::vector<ChatMessage> messages;
  for (int i = 0; i < 2000; ++i) {
    messages.push_back({i % 2 ? "assistant" : "user", std::string(1000, 'a' + i % 26)});
  }
  for (const char* name : {"qwen3", "llama3.1", "llama2", "gemma2", "mistral-nemo", "phi3.5"}) {
    auto r =
        Render(ReadText(SourcePath(std::string("tests/data/chat_templates/") + name + ".jinja")),
               messages);
    ASSERT_TRUE(r.ok()) << name << ": " << r.status();
    EXPECT_GT(r->size(), 2'000'000u) << name;
  }
}

// Work on a large message is charged by its size, so looping over it ends quickly.
TEST(ChatTemplateTest, WorkOnLargeValuesIsCharged) {
  const std::vector<ChatMessage> big = {{"user", std::string(1 << 20, 'x')}};
  for (const char* hostile :
       {"{% for i in range(100000) %}{% if messages[0].content|length %}{% endif %}{% endfor %}",
        "{% for i in range(100000) %}{% if messages[0].content[5] %}{% endif %}{% endfor %}",
        "{% for i in range(100000) %}{% if messages[0].content.strip() %}{% endif %}{% endfor %}",
        "{% set l = [messages[0].content] * 100000 %}{{ l }}",
        "{% set l = [messages[0].content] * 100000 %}{{ l|tojson }}",
        "{% set l = [messages[0].content] * 100000 %}{{ l|join }}"}) {
    // Uncharged, each loop would be 100000 cheap iterations (far below the step limit) over a
    // megabyte each: exhausting the limit is what shows the size is charged.
    auto r = Render(hostile, big);
    ASSERT_FALSE(r.ok()) << hostile;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  }
}

TEST(ChatTemplateTest, CliRendersATemplateFile) {
  TempDir dir;
  const std::string messages = dir.File("m.json");
  std::ofstream(messages) << R"([{"role": "user", "content": "Hi"}])";
  const std::string cmd = std::string(HEAVYKV_BINARY) + " chat-template --template " +
                          SourcePath("tests/data/chat_templates/qwen3.jinja") + " --messages " +
                          messages + " > " + dir.File("out.txt");
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  EXPECT_EQ(ReadText(dir.File("out.txt")),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  const std::string model = SourcePath("../shared/gguf/llama3-vocab.gguf");
  if (!std::ifstream(model)) return;
  const std::string cmd2 = std::string(HEAVYKV_BINARY) + " chat-template --model " + model +
                           " --messages " + messages + " > " + dir.File("out2.txt");
  ASSERT_EQ(std::system(cmd2.c_str()), 0);
  EXPECT_EQ(ReadText(dir.File("out2.txt")),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

}  // namespace
}  // namespace heavykv
