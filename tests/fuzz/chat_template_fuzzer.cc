// Fuzzes the chat-template interpreter (engine/chat/chat_template.h): parses arbitrary input as a
// Jinja template and renders it over a small conversation. Input layout:
//   flags byte | template source | '\0' | a message content (optional)
// (flags bit 0: add_generation_prompt; bit 1: put a system message first). The seeds in
// tests/fuzz/corpus/chat_template_fuzzer/ are the real templates of tests/data/chat_templates/
// in this layout. Parse and Render must return a status, never crash, hang or run past the
// limits: a successful render is at most max_output_bytes, and rendering twice is deterministic.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"
#include "engine/chat/chat_template.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  const std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t nul = input.find('\0');
  const std::string_view source = input.substr(0, nul);
  const std::string content =
      nul == std::string_view::npos ? "Hello!" : std::string(input.substr(nul + 1));

  // Small limits keep each input fast; they are the same code paths as the defaults.
  heavykv::ChatRenderOptions opts;
  opts.limits.max_output_bytes = 1 << 16;
  opts.limits.max_steps = 200000;
  opts.limits.max_depth = 64;
  opts.bos_token = "<s>";
  opts.eos_token = "</s>";
  opts.add_generation_prompt = flags & 1;
  opts.now = absl::FromUnixSeconds(1'800'000'000);
  absl::StatusOr<heavykv::ChatTemplate> t = heavykv::ChatTemplate::Parse(source, opts.limits);
  if (!t.ok()) return 0;
  std::vector<heavykv::ChatMessage> messages;
  if (flags & 2) messages.push_back({"system", "Be brief."});
  messages.push_back({"user", content});
  messages.push_back({"assistant", " \n" + content});
  messages.push_back({"user", "ok"});
  absl::StatusOr<std::string> a = t->Render(messages, opts);
  absl::StatusOr<std::string> b = t->Render(messages, opts);
  if (a.ok() != b.ok() || (a.ok() && *a != *b)) heavykv::fuzz::Die("Render is not deterministic");
  if (a.ok() && a->size() > static_cast<size_t>(opts.limits.max_output_bytes)) {
    heavykv::fuzz::Die("Render output past max_output_bytes");
  }
  return 0;
}
