#include "server/http/openai_http.h"

#include <functional>
#include <mutex>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "engine/serving/request_field.h"
#include "server/common/request_log.h"
#include "server/common/version.h"
#include "server/http/http_metrics.h"
#include "server/http/http_status.h"
#include "server/http/openai_json.h"
#include "server/http/openai_logprobs.h"
#include "server/http/openai_tools.h"
#include "spdlog/spdlog.h"

namespace heavykv::server {
namespace {

constexpr char kJson[] = "application/json";

// `s` with each %XX escape as its byte (a malformed one kept as it is).
std::string PercentDecoded(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    int hi = 0, lo = 0;
    const auto hex = [](char c, int& v) {
      v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                        : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      return v >= 0;
    };
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1], hi) && hex(s[i + 2], lo)) {
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

void SendError(HttpExchange& ex, const absl::Status& status,
               std::vector<std::pair<std::string, std::string>> headers = {}) {
  HttpResponse res;
  res.status = ToHttpError(status.code()).status;
  res.body = ErrorBody(status);
  res.headers = std::move(headers);
  ex.Respond(std::move(res));
}

// A request refused before it ran: counted by `on_rejected` (may be empty), then its error.
void SendRefusal(HttpExchange& ex, const absl::Status& status,
                 const RejectionObserver& on_rejected) {
  if (on_rejected) on_rejected(status.code());
  SendError(ex, status);
}

void SendJson(HttpExchange& ex, const nlohmann::json& value) {
  HttpResponse res;
  res.body = JsonText(value);
  ex.Respond(std::move(res));
}

// The status of a request the engine finished without generating: refused after tokenizing, or
// failed. OK otherwise.
absl::Status FinishStatus(const GenerationDelta& last) {
  if (last.finish_reason == "rejected") return last.status;
  if (last.finish_reason == "error") {
    return absl::InternalError(absl::StrCat("generation failed: ", last.error));
  }
  return absl::OkStatus();
}

// What a response shows of its prompt: completions' echo (its text first, and with logprobs its
// tokens' with `echo_top` top tokens), vLLM's prompt_logprobs (`prompt_top` top tokens).
struct PromptOutput {
  std::optional<std::string> echo;
  int32_t echo_top = 0;
  std::optional<int32_t> prompt_top;
};

// The SSE events of one streamed response (and the pieces of a whole one).
struct Stream {
  ResponseMeta meta;
  bool include_usage = false;
  LogprobsJson logprobs{ApiKind::kCompletion, false};
  PromptOutput prompt;
  bool echo_sent = false;
  nlohmann::json prompt_logprobs;  // vLLM's, once the engine sent the prompt's scores

  // The echoed prompt text, the first time (then ""); the prompt's scores where `d` has them
  // (the engine sends them on the first delta, before any token).
  std::string TakeEcho() {
    if (!prompt.echo || echo_sent) return "";
    echo_sent = true;
    return *prompt.echo;
  }
  void AddPrompt(const GenerationDelta& d) {
    if (d.prompt == nullptr) return;
    if (prompt.echo) logprobs.AddPrompt(*d.prompt, prompt.echo_top, *prompt.echo);
    if (prompt.prompt_top) prompt_logprobs = PromptLogprobsJson(*d.prompt, *prompt.prompt_top);
  }
  // A chat whose output is parsed (tools, reasoning); null: the text as it comes.
  std::unique_ptr<ChatOutput> chat;
  bool role_sent = false;
  bool done = false;

  // The events for `deltas`; sets `done` after the last one and [DONE]. Deltas taken together
  // go out as one event, as gRPC merges queued deltas into one message.
  std::string Events(const std::vector<GenerationDelta>& deltas) {
    std::string out;
    if (meta.kind == ApiKind::kChat && !role_sent) {
      out += SseEvent(StreamChunkJson(meta, "", std::nullopt, /*first=*/true, include_usage));
      role_sent = true;
    }
    std::string text = TakeEcho();  // the first chunk carries the echoed prompt, as vLLM's
    bool tokens = false;
    const GenerationDelta* last = nullptr;
    for (const GenerationDelta& d : deltas) {
      text += d.text;
      tokens |= !d.token_ids.empty() || d.prompt != nullptr;
      AddPrompt(d);
      logprobs.Add(d);
      if (d.finished) last = &d;
    }
    // A chat with tools or reasoning: the text goes out as the parsed delta.
    std::optional<ChatOutputDelta> parsed;
    if (chat != nullptr) {
      parsed = chat->Feed(text);
      if (last != nullptr) parsed->Append(chat->Finish());
    }
    // A token that ends inside a character has no text yet; with logprobs it still goes out.
    const bool content = (parsed ? !parsed->empty() : !text.empty()) ||
                         (tokens && logprobs.enabled());
    if (last != nullptr) LogFinished(meta.id, *last);
    const absl::Status failed = last != nullptr ? FinishStatus(*last) : absl::OkStatus();
    const auto chunk = [&](const std::optional<std::string>& finish_reason) {
      nlohmann::json c =
          StreamChunkJson(meta, text, finish_reason, false, include_usage, logprobs.Take());
      if (parsed) c["choices"][0]["delta"] = ChatDeltaJson(*parsed);
      return SseEvent(c);
    };
    // The finish reason rides on the last chunk; a failed request's text goes out before its
    // error event.
    if (last != nullptr && failed.ok()) {
      out += chunk(chat != nullptr ? ChatFinishReason(last->finish_reason, *chat)
                                   : OpenAiFinishReason(last->finish_reason));
    } else if (content) {
      out += chunk(std::nullopt);
    }
    if (last == nullptr) return out;
    if (!failed.ok()) {
      out += SseEvent(nlohmann::json::parse(ErrorBody(failed)));
    } else if (include_usage) {
      out += SseEvent(UsageChunkJson(meta, last->usage));
    }
    out.append(kSseDone.data(), kSseDone.size());
    done = true;
    return out;
  }
};

// Bytes of a stream queued and not yet written to its client (formatted events in the exchange,
// and an estimate of the deltas not yet formatted) at which its request is held
// (RequestHandle::Hold) until writes drain them: a client that does not read keeps about this
// much memory, not a generation's worth.
constexpr size_t kHoldBytes = 32 << 10;

// The SSE bytes a delta will take, near enough to bound memory with.
size_t EventBytes(const GenerationDelta& d) {
  size_t n = d.text.size() + 200 + 48 * d.token_ids.size();
  for (const auto& step : d.top_logprobs) n += 48 * step.size();
  return n;
}

// One submitted generation. The engine's callback queues its deltas and posts a job to the HTTP
// server's CPU pool unless one is queued already; the job formats every queued delta and hands the
// bytes to the exchange, looping until the queue is empty, so one job at a time runs per request
// and its events go out in order. The engine thread never formats JSON, and no thread waits.
// A stream whose client does not keep up (kHoldBytes queued) is held; each completed write
// (HttpExchange::OnWritten) looks again, so it goes on as soon as the client reads. The HTTP
// server's write timeout, and the engine's stall timeout, end one that never reads.
class Generation final : public std::enable_shared_from_this<Generation> {
 public:
  Generation(std::shared_ptr<HttpExchange> exchange, bool stream, bool include_usage,
             bool logprobs, ResponseMeta meta, RejectionObserver on_rejected,
             std::unique_ptr<ChatOutput> chat, PromptOutput prompt)
      : exchange_(std::move(exchange)),
        stream_(stream),
        on_rejected_(std::move(on_rejected)) {
    sse_.meta = std::move(meta);
    sse_.include_usage = include_usage;
    sse_.logprobs = LogprobsJson(sse_.meta.kind, logprobs);
    sse_.chat = std::move(chat);
    sse_.prompt = std::move(prompt);
  }

  // The client went away (or the server stops): stop the engine's work.
  void Cancel() {
    std::shared_ptr<RequestHandle> handle;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancel_ = true;
      handle = handle_;
    }
    if (handle) handle->Cancel();
  }
  void SetHandle(std::shared_ptr<RequestHandle> handle) {
    bool cancel;
    {
      std::lock_guard<std::mutex> lock(mu_);
      handle_ = handle;
      cancel = cancel_;
      if (held_) handle_->Hold(true);
    }
    if (cancel) handle->Cancel();
  }

  // Engine thread: never blocks.
  void OnDelta(const GenerationDelta& d) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queued_.push_back(d);
      queued_bytes_ += EventBytes(d);
      UpdateHoldLocked();
      if (scheduled_) return;
      scheduled_ = true;
    }
    exchange_->Post([self = shared_from_this()] { self->Run(); });
  }

  // The server's I/O thread: a write of this stream completed.
  void Written() {
    std::lock_guard<std::mutex> lock(mu_);
    UpdateHoldLocked();
  }

 private:
  void Run() {
    for (;;) {
      std::vector<GenerationDelta> batch;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (queued_.empty()) {
          scheduled_ = false;
          return;
        }
        batch.swap(queued_);
        queued_bytes_ = 0;  // the exchange counts them once written to it
      }
      Handle(batch);
    }
  }

  // Holds or releases the request by what is queued for its client. Every change of the counts
  // is followed by a call (a delta, a completed write), and each reads them afresh under mu_, so
  // the last call decides: a request is never left held with nothing queued.
  void UpdateHoldLocked() {
    if (!stream_) return;  // a whole response is bounded by max_tokens, and sent at the end
    const bool hold = exchange_->queued_bytes() + queued_bytes_ >= kHoldBytes;
    if (hold == held_) return;
    held_ = hold;
    if (handle_) handle_->Hold(hold);
  }

  void Handle(const std::vector<GenerationDelta>& batch) {
    if (finished_) return;
    const bool first = !started_;
    started_ = true;
    const GenerationDelta& last = batch.back();
    // No byte goes out before the first delta, so a refusal after tokenizing keeps its status.
    if (first && last.finished && last.finish_reason == "rejected") {
      finished_ = true;
      spdlog::info("request {} rejected: {}", sse_.meta.id, last.status.ToString());
      return SendRefusal(*exchange_, last.status, on_rejected_);
    }
    if (!stream_) {
      text_ += sse_.TakeEcho();
      for (const GenerationDelta& d : batch) {
        text_ += d.text;
        sse_.AddPrompt(d);
        sse_.logprobs.Add(d);
      }
      if (!last.finished) return;
      finished_ = true;
      LogFinished(sse_.meta.id, last);
      if (absl::Status s = FinishStatus(last); !s.ok()) return SendError(*exchange_, s);
      nlohmann::json response =
          ResponseJson(sse_.meta, text_, last, sse_.logprobs.Take(), sse_.prompt_logprobs);
      if (ChatOutput* chat = sse_.chat.get()) {
        ChatOutputDelta whole = chat->Feed(text_);
        whole.Append(chat->Finish());
        response["choices"][0]["message"] = ChatMessageJson(*chat, whole);
        response["choices"][0]["finish_reason"] = ChatFinishReason(last.finish_reason, *chat);
      }
      return SendJson(*exchange_, response);
    }
    if (first) {
      HttpResponse head;
      head.content_type = "text/event-stream";
      head.headers.emplace_back("Cache-Control", "no-cache");
      exchange_->StartStream(std::move(head));
    }
    exchange_->Write(sse_.Events(batch));
    if (sse_.done) {
      finished_ = true;
      exchange_->End();
    }
  }

  const std::shared_ptr<HttpExchange> exchange_;
  const bool stream_;
  const RejectionObserver on_rejected_;

  std::mutex mu_;
  std::vector<GenerationDelta> queued_;    // guarded by mu_
  bool scheduled_ = false;                 // a job is queued or running; guarded by mu_
  std::shared_ptr<RequestHandle> handle_;  // guarded by mu_
  bool cancel_ = false;                    // guarded by mu_
  size_t queued_bytes_ = 0;                // EventBytes of queued_; guarded by mu_
  bool held_ = false;                      // the request is held; guarded by mu_

  // The job's (one at a time).
  bool started_ = false, finished_ = false;
  std::string text_;  // non-streamed: the whole text so far
  Stream sse_;
};

class OpenAiFront {
 public:
  OpenAiFront(Engine* engine, const OpenAiHttpOptions& options,
              std::shared_ptr<const std::atomic<bool>> draining)
      : engine_(engine),
        options_(options),
        draining_(std::move(draining)),
        info_(engine->Info()),
        served_{options.model_name, info_.max_new_tokens_limit,
                info_.chat_template != nullptr
                    ? DetectToolCallFormat(info_.chat_template->source())
                    : ToolCallFormat::kGeneric},
        created_(absl::ToUnixSeconds(absl::Now())) {}

  HttpServer::Routes Routes(std::shared_ptr<OpenAiFront> self) const {
    HttpServer::Routes routes;
    const auto bind = [self](void (OpenAiFront::*method)(const HttpRequest&,
                                                         std::shared_ptr<HttpExchange>)) {
      // A request from an allowed browser origin gets its CORS header on whatever the route
      // answers, streams included.
      return [self, method](const HttpRequest& req, std::shared_ptr<HttpExchange> ex) {
        ((*self).*method)(req, WithCors(self->options_.cors, req, std::move(ex)));
      };
    };
    routes.Add("/v1/completions", "POST", bind(&OpenAiFront::Completions));
    routes.Add("/v1/chat/completions", "POST", bind(&OpenAiFront::ChatCompletions));
    routes.Add("/v1/models", "GET", bind(&OpenAiFront::Models));
    routes.Add("/v1/models/*", "GET", bind(&OpenAiFront::Model));
    // Answered on the event loop: a load balancer's probe never waits behind the pool's work.
    routes.AddOnLoop("/health", "GET", bind(&OpenAiFront::Health));
    routes.AddOnLoop("/version", "GET", bind(&OpenAiFront::Version));
    if (options_.metrics != nullptr) routes.Add("/metrics", "GET", bind(&OpenAiFront::Scrape));
    routes.Add("/tokenize", "POST", bind(&OpenAiFront::Tokenize));
    routes.Add("/detokenize", "POST", bind(&OpenAiFront::Detokenize));
    if (options_.cors.enabled()) {  // preflights: no key (a browser sends none on them)
      std::vector<std::pair<std::string, std::string>> preflights;
      for (const auto& [path, methods] : routes.by_path()) {
        std::vector<std::string> names;
        for (const auto& [name, handler] : methods) names.push_back(name);
        preflights.emplace_back(path, absl::StrJoin(names, ", "));
      }
      for (const auto& preflight : preflights) {
        routes.Add(preflight.first, "OPTIONS",
                   [self, allowed = preflight.second](const HttpRequest& req,
                                                      std::shared_ptr<HttpExchange> ex) {
                     ex->Respond(CorsPreflight(self->options_.cors, req, allowed));
                   });
      }
    }
    return routes;
  }

 private:
  // True when no key is needed or the request carries a listed one; else answers 401.
  bool Authorized(const HttpRequest& req, HttpExchange& ex) const {
    if (options_.api_keys == nullptr) return true;
    absl::Status s = options_.api_keys->Check(req.Header("Authorization"));
    if (s.ok()) return true;
    spdlog::info("HTTP {} refused from {}: {}", req.path, req.remote_addr, std::string(s.message()));
    if (options_.on_rejected) options_.on_rejected(s.code());
    SendError(ex, WithErrorCode(s, "invalid_api_key"), {{"WWW-Authenticate", "Bearer"}});
    return false;
  }

  std::string ClientOf(const HttpRequest& req) const {
    if (options_.api_keys != nullptr) {
      return absl::StrCat("key:", std::hash<std::string>{}(req.Header("Authorization")));
    }
    return absl::StrCat("http:", req.remote_addr, ":", req.remote_port);
  }

  void Refused(HttpExchange& ex, const absl::Status& s) const {
    SendRefusal(ex, s, options_.on_rejected);
  }

  void Completions(const HttpRequest& req, std::shared_ptr<HttpExchange> ex) {
    Generate(ApiKind::kCompletion, req, std::move(ex));
  }
  void ChatCompletions(const HttpRequest& req, std::shared_ptr<HttpExchange> ex) {
    Generate(ApiKind::kChat, req, std::move(ex));
  }

  // Parses, submits and returns: the Generation answers from the engine's deltas.
  void Generate(ApiKind kind, const HttpRequest& req, std::shared_ptr<HttpExchange> ex) {
    if (!Authorized(req, *ex)) return;
    absl::StatusOr<OpenAiRequest> q = ParseGenerationBody(kind, req.body, served_);
    if (!q.ok()) return Refused(*ex, q.status());
    ResponseMeta meta{kind,
                      absl::StrCat(kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-",
                                   next_id_.fetch_add(1)),
                      absl::ToUnixSeconds(absl::Now()), options_.model_name};
    q->generation.request_id = meta.id;
    q->generation.client = ClientOf(req);
    // Cached prompt prefixes stay with their API key (ClientOf names it when keys are on).
    if (options_.api_keys != nullptr) q->generation.tenant = q->generation.client;

    // A chat's output is parsed for reasoning and tool calls where its template and tools say
    // so; the call ids follow the request's seed when it has one.
    std::unique_ptr<ChatOutput> chat;
    if (kind == ApiKind::kChat) {
      const uint64_t seed = q->generation.seed.value_or(std::random_device{}());
      ChatOutputOptions parse = ChatOutputOptionsFor(info_.chat_template.get(), q->generation,
                                                     q->tools, seed ^ 0x9e3779b97f4a7c15ULL);
      ConstrainAfterReasoning(parse, q->generation.constraint);
      ChatOutput parsed(std::move(parse));
      if (parsed.active()) chat = std::make_unique<ChatOutput>(std::move(parsed));
    }
    absl::StatusOr<PromptOutput> prompt = PromptOutputOf(*q);
    if (!prompt.ok()) return Refused(*ex, prompt.status());
    auto generation = std::make_shared<Generation>(
        ex, q->stream, q->include_usage, q->generation.logprobs, std::move(meta),
        options_.on_rejected, std::move(chat), *std::move(prompt));
    // A client that goes (or a server that stops) before the end cancels the engine's work; the
    // engine then sends its finished delta, whose events go nowhere.
    ex->OnAbort([weak = std::weak_ptr<Generation>(generation)] {
      if (std::shared_ptr<Generation> g = weak.lock()) g->Cancel();
    });
    ex->OnWritten([weak = std::weak_ptr<Generation>(generation)] {
      if (std::shared_ptr<Generation> g = weak.lock()) g->Written();
    });
    absl::StatusOr<std::shared_ptr<RequestHandle>> handle = engine_->Submit(
        q->generation, [generation](const GenerationDelta& d) { generation->OnDelta(d); });
    if (!handle.ok()) {
      absl::Status s = handle.status();
      // A constraint that does not compile: the field it came from.
      if (RequestFieldOf(s) == "constraint" && !q->constraint_param.empty()) {
        s = WithParam(std::move(s), q->constraint_param);
      }
      return Refused(*ex, s);
    }
    generation->SetHandle(*std::move(handle));
  }

  // What the response shows of the prompt: echo's text is the prompt's, or for token ids their
  // text as /detokenize gives it.
  absl::StatusOr<PromptOutput> PromptOutputOf(const OpenAiRequest& q) const {
    PromptOutput out;
    out.prompt_top = q.prompt_logprobs;
    if (!q.echo) return out;
    out.echo_top = q.generation.top_logprobs;
    if (q.generation.prompt.has_value()) {
      out.echo = *q.generation.prompt;
      return out;
    }
    absl::StatusOr<std::string> text =
        engine_->Detokenize(q.generation.prompt_token_ids, /*skip_special_tokens=*/false);
    if (!text.ok()) return WithParam(text.status(), "prompt");
    out.echo = *std::move(text);
    return out;
  }

  void Models(const HttpRequest& req, std::shared_ptr<HttpExchange> ex) {
    if (!Authorized(req, *ex)) return;
    SendJson(*ex, ModelsJson(options_.model_name, created_, info_.context_length));
  }

  // GET /v1/models/{id}: the served model, by its name (percent-decoded, as clients escape it).
  void Model(const HttpRequest& req, std::shared_ptr<HttpExchange> ex) {
    if (!Authorized(req, *ex)) return;
    const std::string id = PercentDecoded(req.path.substr(std::string("/v1/models/").size()));
    if (id != options_.model_name) {
      return SendError(*ex, WithParam(WithErrorCode(absl::NotFoundError(absl::StrCat(
                                                        "the model `", id.substr(0, 256),
                                                        "` does not exist; this server serves `",
                                                        options_.model_name, "`")),
                                                    "model_not_found"),
                                      "model"));
    }
    SendJson(*ex, ModelJson(options_.model_name, created_, info_.context_length));
  }

  void Version(const HttpRequest&, std::shared_ptr<HttpExchange> ex) {
    SendJson(*ex, {{"version", kHeavykvVersion}});
  }

  // vLLM serves the scrape on its API port too; here it needs the key when keys are on.
  void Scrape(const HttpRequest& req, std::shared_ptr<HttpExchange> ex) {
    if (!Authorized(req, *ex)) return;
    ex->Respond(MetricsResponse(*options_.metrics));
  }

  void Health(const HttpRequest&, std::shared_ptr<HttpExchange> ex) {
    if (draining_->load()) {
      return SendError(*ex, absl::UnavailableError("the server is draining; retry elsewhere"));
    }
    SendJson(*ex, nlohmann::json::object());
  }

  void Tokenize(const HttpRequest& req, std::shared_ptr<HttpExchange> ex) {
    if (!Authorized(req, *ex)) return;
    absl::StatusOr<TokenizeBody> q = ParseTokenizeBody(req.body, served_);
    if (!q.ok()) return SendError(*ex, q.status());
    absl::StatusOr<std::vector<int32_t>> ids =
        q->chat ? engine_->TokenizeChat(*q->chat)
                : engine_->Tokenize(q->prompt, q->add_special_tokens);
    if (!ids.ok()) {
      return SendError(*ex, WithParam(ids.status(), q->chat ? "messages" : "prompt"));
    }
    SendJson(*ex, {{"count", ids->size()},
                   {"max_model_len", info_.context_length},
                   {"tokens", *ids}});
  }

  void Detokenize(const HttpRequest& req, std::shared_ptr<HttpExchange> ex) {
    if (!Authorized(req, *ex)) return;
    absl::StatusOr<std::vector<int32_t>> ids = ParseDetokenizeBody(req.body, served_);
    if (!ids.ok()) return SendError(*ex, ids.status());
    absl::StatusOr<std::string> text = engine_->Detokenize(*ids, /*skip_special_tokens=*/false);
    if (!text.ok()) return SendError(*ex, WithParam(text.status(), "tokens"));
    SendJson(*ex, {{"prompt", *text}});
  }

  Engine* const engine_;
  const OpenAiHttpOptions options_;
  const std::shared_ptr<const std::atomic<bool>> draining_;
  const ModelInfo info_;
  const OpenAiServed served_;
  const int64_t created_;
  std::atomic<int64_t> next_id_ = 1;
};

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> StartOpenAiHttp(
    Engine* engine, const OpenAiHttpOptions& options,
    std::shared_ptr<const std::atomic<bool>> draining) {
  auto front = std::make_shared<OpenAiFront>(engine, options, std::move(draining));
  const ModelInfo info = engine->Info();
  HttpServerOptions http;
  http.cpu_threads = options.threads;
  http.header_timeout = options.header_timeout;
  http.body_timeout = options.body_timeout;
  http.idle_timeout = options.idle_timeout;
  http.write_timeout = options.write_timeout;
  http.keep_alive_max_requests = 100;
  http.max_connections = options.max_connections;
  http.max_connections_per_client = options.max_connections_per_client;
  http.max_head_bytes = 16 << 10;
  // A prompt at the engine's limits, JSON-escaped (at most 6 bytes a byte) or as token ids (at
  // most 11 digits and a comma each), plus room for the other fields and a chat's structure.
  http.max_body_bytes = size_t(64 << 10) + 6 * size_t(info.max_prompt_bytes) +
                        12 * size_t(info.max_prompt_tokens);
  http.error_body = [limit = http.max_body_bytes](int status, HttpResponse& res) {
    absl::Status s;
    switch (status) {
      case 404:
        s = absl::NotFoundError(
            "no such route: POST /v1/completions, /v1/chat/completions, /tokenize, /detokenize; "
            "GET /v1/models, /v1/models/{id}, /health, /version, /metrics");
        break;
      case 405:
        s = absl::InvalidArgumentError("this route does not take that method (see Allow)");
        break;
      case 413:
        s = absl::InvalidArgumentError(
            absl::StrCat("the request body is over ", limit, " bytes, more than any prompt "
                         "this server takes"));
        break;
      case 408:
        s = absl::DeadlineExceededError(
            "the request did not arrive in time (see --http-header-timeout, "
            "--http-body-timeout)");
        break;
      case 417:
        s = absl::InvalidArgumentError("the only expectation this server meets is 100-continue");
        break;
      case 429:
        s = absl::ResourceExhaustedError(
            "too many connections from this address (--http-max-connections-per-client); "
            "reuse connections or retry later");
        break;
      case 503:
        s = absl::UnavailableError(
            "the server holds as many connections as it takes (--http-max-connections); "
            "retry later");
        break;
      case 500:
        s = absl::InternalError("the request failed inside the server");
        break;
      default:
        s = absl::InvalidArgumentError("malformed HTTP request");
    }
    res.content_type = kJson;
    res.body = ErrorBody(s);
  };
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start(options.address, front->Routes(front), http);
  if (!server.ok()) {
    return absl::Status(server.status().code(),
                        absl::StrCat("OpenAI HTTP API: ", server.status().message(),
                                     "; choose another --http-address (empty: off)"));
  }
  return server;
}

}  // namespace heavykv::server
