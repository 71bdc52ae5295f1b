// heavykv generate: one streamed generation from a running `heavykv serve`. The text goes to
// stdout as it arrives; one summary line (finish reason, tokens, timings) goes to stderr. With
// --chat the PROMPT is one user message (after an optional --system message) sent to the Chat RPC,
// which renders it with the server's chat template. With --prompt-logprobs N the prompt's scores
// follow the text on stdout, one line per prompt token (in --json, "prompt_logprobs").
#include <chrono>
#include <cstdio>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "heavykv/v1/generation.grpc.pb.h"
#include "server/cli/commands.h"
#include "server/client/client_request.h"
#include "server/flags/cli_flags.h"
#include "server/grpc/proto_convert.h"

namespace heavykv::cli {
namespace {

// With --prompt-logprobs, to stdout after the text: one line per prompt token, "id<TAB>logprob"
// ("-" for the first, which has none) and then the most likely tokens as "id:logprob".
void PrintPromptLogprobs(const v1::PromptLogprobs& p) {
  for (int i = 0; i < p.token_ids_size(); ++i) {
    std::string line = absl::StrCat(p.token_ids(i), "\t",
                                    i == 0 ? std::string("-") : absl::StrCat(p.logprobs(i)));
    if (i < p.top_size()) {
      for (int k = 0; k < p.top(i).token_ids_size(); ++k) {
        absl::StrAppend(&line, "\t", p.top(i).token_ids(k), ":", p.top(i).logprobs(k));
      }
    }
    std::printf("%s\n", line.c_str());
  }
}

// --json's "prompt_logprobs": {"token_ids", "logprobs" (null first), "top" ([[id, logprob]...]
// per token)}; null without them.
nlohmann::ordered_json PromptLogprobsJson(const v1::PromptLogprobs& p) {
  if (p.token_ids_size() == 0) return nullptr;
  nlohmann::ordered_json logprobs = nlohmann::ordered_json::array(), top = logprobs;
  for (int i = 0; i < p.logprobs_size(); ++i) {
    logprobs.push_back(i == 0 ? nlohmann::ordered_json() : nlohmann::ordered_json(p.logprobs(i)));
  }
  for (const v1::TopLogprobs& t : p.top()) {
    nlohmann::ordered_json step = nlohmann::ordered_json::array();
    for (int k = 0; k < t.token_ids_size(); ++k) step.push_back({t.token_ids(k), t.logprobs(k)});
    top.push_back(std::move(step));
  }
  return {{"token_ids", std::vector<int32_t>(p.token_ids().begin(), p.token_ids().end())},
          {"logprobs", std::move(logprobs)},
          {"top", std::move(top)}};
}

}  // namespace

int GenerateCommand(int argc, char** argv) {
  ConnectionFlags conn;
  std::string request_id;
  std::string system;
  bool token_ids = false, json = false, chat = false;
  double timeout = 0;
  RequestFlags rf;
  FlagSet flags("generate", "heavykv generate --server ADDR [flags] PROMPT");
  AddConnectionFlags(flags, &conn);
  flags.String("request-id", &request_id, "request id (unset: the server makes one)");
  flags.Bool("token-ids", &token_ids, "PROMPT is token ids separated by spaces, not text");
  flags.Bool("chat", &chat, "send PROMPT as a user message to Chat (the server's chat template)");
  flags.String("system", &system, "with --chat: a system message before PROMPT");
  flags.Double("timeout", &timeout, "deadline in seconds; 0 = none");
  flags.Bool("json", &json, "print the token ids and the summary as one JSON object instead");
  AddRequestFlags(flags, &rf);
  if (std::optional<int> code = ParseOrExit(flags, argc, argv)) return *code;
  const std::string prompt = absl::StrJoin(flags.positional(), " ");
  if (prompt.empty()) return Fail(absl::InvalidArgumentError("give a PROMPT"));
  if (chat && token_ids) {
    return Fail(absl::InvalidArgumentError("--chat sends text: leave out --token-ids"));
  }
  if (!chat && flags.IsSet("system")) {
    return Fail(absl::InvalidArgumentError("--system needs --chat"));
  }

  v1::GenerateRequest request;
  v1::ChatRequest chat_request;
  request.set_request_id(request_id);
  chat_request.set_request_id(request_id);
  if (chat) {
    if (flags.IsSet("system")) {
      v1::ChatMessage* m = chat_request.add_messages();
      m->set_role("system");
      m->set_content(system);
    }
    v1::ChatMessage* m = chat_request.add_messages();
    m->set_role("user");
    m->set_content(prompt);
  } else if (token_ids) {
    v1::TokenIds* ids = request.mutable_prompt_token_ids();
    for (absl::string_view part :
         absl::StrSplit(prompt, absl::ByAnyChar(" ,"), absl::SkipEmpty())) {
      int32_t id;
      if (!absl::SimpleAtoi(part, &id)) {
        return Fail(absl::InvalidArgumentError(
            absl::StrCat("with --token-ids the prompt must be integers; got \"", part, "\"")));
      }
      ids->add_ids(id);
    }
  } else {
    request.set_prompt(prompt);
  }
  if (absl::Status s =
          chat ? FillRequest(flags, rf, &chat_request) : FillRequest(flags, rf, &request);
      !s.ok()) {
    return Fail(s);
  }

  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = Connect(&conn);
  if (!channel.ok()) return Fail(channel.status());
  std::unique_ptr<v1::Generation::Stub> stub = v1::Generation::NewStub(*channel);
  grpc::ClientContext context;
  Authorize(conn, &context);
  if (timeout > 0) {
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::microseconds(static_cast<int64_t>(timeout * 1e6)));
  }
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      chat ? stub->Chat(&context, chat_request) : stub->Generate(&context, request);
  v1::GenerateResponse message, last;
  v1::PromptLogprobs prompt_scores;  // with --prompt-logprobs: from the first message
  std::string id;  // the server sends the request id in the first message only
  // By choice (--n): one text streams as it comes; several are printed whole at the end.
  struct Choice {
    std::string text;
    std::vector<int32_t> ids;
    v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  };
  std::map<int32_t, Choice> choices;
  const bool several = rf.n > 1;
  while (reader->Read(&message)) {
    if (id.empty()) id = message.request_id();
    if (message.has_prompt_logprobs()) prompt_scores = message.prompt_logprobs();
    Choice& c = choices[message.index()];
    c.text += message.text();
    c.ids.insert(c.ids.end(), message.token_ids().begin(), message.token_ids().end());
    if (!json && !several) {
      std::fwrite(message.text().data(), 1, message.text().size(), stdout);
      std::fflush(stdout);
    }
    if (message.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      c.finish = message.finish_reason();
      last = message;
    }
  }
  const grpc::Status status = reader->Finish();
  const std::string text = choices[0].text;
  const std::vector<int32_t> ids = choices[0].ids;
  if (!json && several && status.ok()) {
    for (const auto& [index, c] : choices) {
      std::printf("--- choice %d (%s)\n%s\n", index, server::FinishReasonName(c.finish).c_str(),
                  c.text.c_str());
    }
  } else if (!json && !several && !text.empty()) {
    std::fputc('\n', stdout);
  }
  if (!status.ok()) {
    std::fprintf(stderr, "error: %s: %s\n", StatusCodeName(status.error_code()).c_str(),
                 status.error_message().c_str());
    return 1;
  }
  const v1::Usage& u = last.usage();
  const v1::Timings& t = last.timings();
  if (json) {
    nlohmann::ordered_json all = nlohmann::ordered_json::array();
    for (const auto& [index, c] : choices) {
      all.push_back({{"index", index},
                     {"text", c.text},
                     {"token_ids", c.ids},
                     {"finish_reason", server::FinishReasonName(c.finish)}});
    }
    PrintJsonLine({{"request_id", id},
                   {"choices", all},
                   {"text", text},
                   {"token_ids", ids},
                   {"prompt_logprobs", PromptLogprobsJson(prompt_scores)},
                   {"finish_reason", server::FinishReasonName(last.finish_reason())},
                   {"prompt_tokens", u.prompt_tokens()},
                   {"completion_tokens", u.completion_tokens()},
                   {"policy", u.policy()},
                   {"kv_budget_tokens", u.kv_budget_tokens()},
                   {"kv_tokens_kept", u.kv_tokens_kept()},
                   {"kv_tokens_evicted", u.kv_tokens_evicted()},
                   {"peak_pages", u.peak_pages()},
                   {"queue_seconds", Rounded(t.queue_seconds(), 6)},
                   {"time_to_first_token_seconds", Rounded(t.time_to_first_token_seconds(), 6)},
                   {"total_seconds", Rounded(t.total_seconds(), 6)}});
  } else {
    PrintPromptLogprobs(prompt_scores);
    std::fprintf(stderr,
                 "finish %s: %d prompt + %d completion tokens, ttft %.3fs, total %.3fs, "
                 "policy %s budget %d, peak pages %d, evicted %lld\n",
                 server::FinishReasonName(last.finish_reason()).c_str(), u.prompt_tokens(),
                 u.completion_tokens(), t.time_to_first_token_seconds(), t.total_seconds(),
                 u.policy().c_str(), u.kv_budget_tokens(), u.peak_pages(),
                 static_cast<long long>(u.kv_tokens_evicted()));
  }
  return 0;
}

}  // namespace heavykv::cli
