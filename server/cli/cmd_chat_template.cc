// heavykv chat-template (--template FILE.jinja | --model MODEL.gguf) --messages FILE.json
// [--no-generation-prompt] [--bos S] [--eos S] [--date YYYY-MM-DD]: prints the prompt a chat
// template (engine/chat/chat_template.h) renders for a conversation, byte for byte as Hugging Face
// transformers would. With --model the template is the GGUF's tokenizer.chat_template and BOS/EOS
// default to the vocabulary's strings at tokenizer.ggml.{bos,eos}_token_id.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "engine/chat/chat_template.h"
#include "engine/gguf/gguf.h"
#include "nlohmann/json.hpp"
#include "server/cli/commands.h"
#include "server/flags/cli_flags.h"

namespace heavykv::cli {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// [{"role": ..., "content": ...}, ...], or an object holding that list as "messages".
absl::StatusOr<std::vector<ChatMessage>> ParseMessages(const std::string& text,
                                                       const std::string& path) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": not JSON"));
  if (j.is_object() && j.contains("messages")) j = j["messages"];
  if (!j.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": expected a list of messages"));
  }
  std::vector<ChatMessage> messages;
  for (const auto& m : j) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": each message needs string \"role\" and \"content\" fields"));
    }
    messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return messages;
}

// The template and BOS/EOS strings a GGUF file carries.
absl::Status ReadModel(const std::string& path, std::string* source, std::string* bos,
                       std::string* eos) {
  auto file = GgufFile::Open(path);
  if (!file.ok()) return file.status();
  auto tmpl = file->GetString("tokenizer.chat_template");
  if (!tmpl.ok()) {
    return absl::NotFoundError(absl::StrCat(path, " has no tokenizer.chat_template"));
  }
  *source = std::string(*tmpl);
  auto tokens = file->GetArrayString("tokenizer.ggml.tokens");
  if (!tokens.ok()) return absl::OkStatus();
  auto token = [&](const char* key, std::string* out) {
    auto ids = file->GetI64(key);
    if (ids.ok() && *ids >= 0 && static_cast<size_t>(*ids) < tokens->size()) {
      *out = std::string((*tokens)[static_cast<size_t>(*ids)]);
    }
  };
  if (bos->empty()) token("tokenizer.ggml.bos_token_id", bos);
  if (eos->empty()) token("tokenizer.ggml.eos_token_id", eos);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<const ChatTemplate>> LoadChatTemplate(
    const std::string& override_path, const std::string& model_path) {
  if (!override_path.empty()) {
    absl::StatusOr<std::string> text = ReadFile(override_path);
    if (!text.ok()) return text.status();
    absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(*text);
    if (!t.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--chat-template ", override_path, ": ", t.status().message()));
    }
    return std::make_shared<const ChatTemplate>(*std::move(t));
  }
  if (!IsGgufFile(model_path)) return nullptr;
  absl::StatusOr<GgufFile> file = GgufFile::Open(model_path);
  if (!file.ok()) return file.status();
  if (file->FindMetadata("tokenizer.chat_template") == nullptr) return nullptr;
  absl::StatusOr<absl::string_view> source = file->GetString("tokenizer.chat_template");
  if (!source.ok()) return source.status();
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(std::string_view(source->data(), source->size()));
  if (!t.ok()) {
    std::fprintf(stderr,
                 "note: %s: its tokenizer.chat_template does not parse (%s); Chat needs "
                 "--chat-template FILE\n",
                 model_path.c_str(), std::string(t.status().message()).c_str());
    return nullptr;
  }
  return std::make_shared<const ChatTemplate>(*std::move(t));
}

int ChatTemplateCommand(int argc, char** argv) {
  std::string template_path, model_path, messages_path, bos, eos, date;
  bool no_generation_prompt = false;
  FlagSet flags("chat-template",
                "heavykv chat-template (--template FILE.jinja | --model MODEL.gguf) "
                "--messages FILE.json [flags]");
  flags.String("template", &template_path, "a Jinja chat template file");
  flags.String("model", &model_path, "a GGUF model: its tokenizer.chat_template and BOS/EOS");
  flags.String("messages", &messages_path,
               "JSON: [{\"role\": \"user\", \"content\": \"...\"}, ...]");
  flags.Bool("no-generation-prompt", &no_generation_prompt,
             "render with add_generation_prompt=false");
  flags.String("bos", &bos, "bos_token (default: the model's, else empty)");
  flags.String("eos", &eos, "eos_token (default: the model's, else empty)");
  flags.String("date", &date, "the UTC date strftime_now() sees, YYYY-MM-DD (default: now)");
  if (std::optional<int> code = ParseOrExit(flags, argc, argv)) return *code;
  if (template_path.empty() == model_path.empty() || messages_path.empty()) {
    return Fail(absl::InvalidArgumentError(
        "give --messages and one of --template or --model (see heavykv chat-template --help)"));
  }
  std::string source;
  if (!model_path.empty()) {
    if (absl::Status s = ReadModel(model_path, &source, &bos, &eos); !s.ok()) return Fail(s);
  } else {
    auto text = ReadFile(template_path);
    if (!text.ok()) return Fail(text.status());
    source = std::move(*text);
  }
  auto messages_text = ReadFile(messages_path);
  if (!messages_text.ok()) return Fail(messages_text.status());
  auto messages = ParseMessages(*messages_text, messages_path);
  if (!messages.ok()) return Fail(messages.status());
  ChatRenderOptions opts;
  opts.bos_token = bos;
  opts.eos_token = eos;
  opts.add_generation_prompt = !no_generation_prompt;
  if (!date.empty()) {
    absl::Time t;
    std::string err;
    if (!absl::ParseTime("%Y-%m-%d", date, absl::UTCTimeZone(), &t, &err)) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("--date: ", err)));
    }
    opts.now = t;
  }
  auto tmpl = ChatTemplate::Parse(source);
  if (!tmpl.ok()) return Fail(tmpl.status());
  auto prompt = tmpl->Render(*messages, opts);
  if (!prompt.ok()) return Fail(prompt.status());
  std::fwrite(prompt->data(), 1, prompt->size(), stdout);
  return 0;
}

}  // namespace heavykv::cli
