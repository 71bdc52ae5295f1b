#include "server/http/openai_http.h"

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <span>
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

// One choice's output so far (GenerationRequest::n; choice 0 alone for n = 1).
struct ChoiceOut {
  bool echo_sent = false;
  LogprobsJson logprobs{ApiKind::kCompletion, false};
  // A chat whose output is parsed (tools, reasoning); null: the text as it comes.
  std::unique_ptr<ChatOutput> chat;
  bool role_sent = false;
  std::string text;  // non-streamed: the whole text so far
  std::optional<GenerationDelta> last;  // its choice_finished delta, once it came
};

// The choices of one response, made as their first deltas come.
struct Choices {
  ResponseMeta meta;
  bool logprobs = false;
  PromptOutput prompt;
  // The prompt's scores, from the engine's first delta (choice 0's, before any token), and
  // vLLM's prompt_logprobs made of them.
  std::shared_ptr<const PromptLogprobs> scores;
  nlohmann::json prompt_logprobs;
  // A parser of choice i's chat output (tools, reasoning), or null when the output is not parsed.
  std::function<std::unique_ptr<ChatOutput>(int32_t)> make_chat;
  std::map<int32_t, ChoiceOut> by_index;

  ChoiceOut& At(int32_t index) {
    auto it = by_index.find(index);
    if (it != by_index.end()) return it->second;
    ChoiceOut& c = by_index[index];
    c.logprobs = LogprobsJson(meta.kind, logprobs);
    if (make_chat) c.chat = make_chat(index);
    return c;
  }

  // Takes `d` of choice `c` in: returns the text it adds (after the echoed prompt, on the
  // choice's first delta; every choice echoes it, as vLLM's do), its logprobs (the prompt's
  // first, with echo and logprobs).
  std::string Feed(ChoiceOut& c, const GenerationDelta& d) {
    if (d.prompt != nullptr && scores == nullptr) {
      scores = d.prompt;
      if (prompt.prompt_top) prompt_logprobs = PromptLogprobsJson(*scores, *prompt.prompt_top);
    }
    std::string text;
    if (prompt.echo && !c.echo_sent) {
      c.echo_sent = true;
      text = *prompt.echo;
      if (scores != nullptr) c.logprobs.AddPrompt(*scores, prompt.echo_top, *prompt.echo);
    }
    c.logprobs.Add(d);
    return text + d.text;
  }
};

// The runs of consecutive deltas of one choice in `deltas`, in order.
std::vector<std::span<const GenerationDelta>> RunsByChoice(const std::vector<GenerationDelta>& deltas) {
  std::vector<std::span<const GenerationDelta>> runs;
  for (size_t i = 0; i < deltas.size();) {
    size_t j = i + 1;
    while (j < deltas.size() && deltas[j].index == deltas[i].index) ++j;
    runs.emplace_back(deltas.data() + i, j - i);
    i = j;
  }
  return runs;
}

// The SSE events of one streamed response.
struct Stream {
  Choices choices;
  bool include_usage = false;
  bool done = false;

  // The events for `deltas`; sets `done` after the last one and [DONE]. Deltas of one choice
  // taken together go out as one event, as gRPC merges queued deltas into one message; choices
  // interleave by index as they came.
  std::string Events(const std::vector<GenerationDelta>& deltas) {
    std::string out;
    const GenerationDelta* last = nullptr;
    absl::Status failed;
    for (std::span<const GenerationDelta> run : RunsByChoice(deltas)) {
      out += ChoiceEvents(run, &failed);
      if (run.back().finished) last = &run.back();
    }
    if (last == nullptr) return out;
    LogFinished(choices.meta.id, *last);
    if (!failed.ok()) {
      out += SseEvent(nlohmann::json::parse(ErrorBody(failed)));
    } else if (include_usage) {
      out += SseEvent(UsageChunkJson(choices.meta, last->usage));
    }
    out.append(kSseDone.data(), kSseDone.size());
    done = true;
    return out;
  }

 private:
  // One choice's deltas; *failed set when the request ended failing (a request of one choice:
  // the error goes out as an error event; one of several ends "abort", as a cancelled one).
  std::string ChoiceEvents(std::span<const GenerationDelta> run, absl::Status* failed) {
    const ResponseMeta& meta = choices.meta;
    const int32_t index = run.front().index;
    ChoiceOut& c = choices.At(index);
    std::string out;
    if (meta.kind == ApiKind::kChat && !c.role_sent) {
      out += SseEvent(
          StreamChunkJson(meta, "", std::nullopt, /*first=*/true, include_usage, nullptr, index));
      c.role_sent = true;
    }
    std::string text;
    bool tokens = false;
    const GenerationDelta* last = nullptr;
    for (const GenerationDelta& d : run) {
      text += choices.Feed(c, d);  // the first chunk carries the echoed prompt, as vLLM's
      tokens |= !d.token_ids.empty() || d.prompt != nullptr;
      if (d.choice_finished) last = &d;
    }
    // A chat with tools or reasoning: the text goes out as the parsed delta.
    std::optional<ChatOutputDelta> parsed;
    if (c.chat != nullptr) {
      parsed = c.chat->Feed(text);
      if (last != nullptr) parsed->Append(c.chat->Finish());
    }
    // A token that ends inside a character has no text yet; with logprobs it still goes out.
    const bool content = (parsed ? !parsed->empty() : !text.empty()) ||
                         (tokens && c.logprobs.enabled());
    if (last != nullptr && choices.by_index.size() == 1 && last->finished) {
      *failed = FinishStatus(*last);
    }
    const auto chunk = [&](const std::optional<std::string>& finish_reason) {
      nlohmann::json j = StreamChunkJson(meta, text, finish_reason, false, include_usage,
                                         c.logprobs.Take(), index);
      if (parsed) j["choices"][0]["delta"] = ChatDeltaJson(*parsed);
      return SseEvent(j);
    };
    // The finish reason rides on the choice's last chunk; a failed request's text goes out
    // before its error event.
    if (last != nullptr && failed->ok()) {
      out += chunk(c.chat != nullptr ? ChatFinishReason(last->finish_reason, *c.chat)
                                     : OpenAiFinishReason(last->finish_reason));
    } else if (content) {
      out += chunk(std::nullopt);
    }
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
  // `make_chat`: choice i's chat output parser (null when chat output is not parsed).
  Generation(std::shared_ptr<HttpExchange> exchange, bool stream, bool include_usage,
             bool logprobs, ResponseMeta meta, RejectionObserver on_rejected,
             std::function<std::unique_ptr<ChatOutput>(int32_t)> make_chat, PromptOutput prompt)
      : exchange_(std::move(exchange)),
        stream_(stream),
        on_rejected_(std::move(on_rejected)) {
    sse_.choices.meta = std::move(meta);
    sse_.choices.logprobs = logprobs;
    sse_.choices.make_chat = std::move(make_chat);
    sse_.choices.prompt = std::move(prompt);
    sse_.include_usage = include_usage;
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
    const ResponseMeta& meta = sse_.choices.meta;
    if (first && last.finished && last.finish_reason == "rejected") {
      finished_ = true;
      spdlog::info("request {} rejected: {}", meta.id, last.status.ToString());
      return SendRefusal(*exchange_, last.status, on_rejected_);
    }
    if (!stream_) {
      for (const GenerationDelta& d : batch) {
        ChoiceOut& c = sse_.choices.At(d.index);
        c.text += sse_.choices.Feed(c, d);
        if (d.choice_finished) c.last = d;
      }
      if (!last.finished) return;
      finished_ = true;
      LogFinished(meta.id, last);
      std::map<int32_t, ChoiceOut>& all = sse_.choices.by_index;
      if (all.size() == 1) {  // one choice: its failure is the response's
        if (absl::Status s = FinishStatus(last); !s.ok()) return SendError(*exchange_, s);
      }
      nlohmann::json choices = nlohmann::json::array();
      for (auto& [index, c] : all) {
        const std::string reason = c.last ? c.last->finish_reason : last.finish_reason;
        nlohmann::json choice = ChoiceJson(meta.kind, index, c.text, reason, c.logprobs.Take(),
                                           sse_.choices.prompt_logprobs);
        if (ChatOutput* chat = c.chat.get()) {
          ChatOutputDelta whole = chat->Feed(c.text);
          whole.Append(chat->Finish());
          choice["message"] = ChatMessageJson(*chat, whole);
          choice["finish_reason"] = ChatFinishReason(reason, *chat);
        }
        choices.push_back(std::move(choice));
      }
      return SendJson(*exchange_, ResponseJson(meta, std::move(choices), last.usage,
                                               sse_.choices.prompt_logprobs));
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
  Stream sse_;  // its choices are the non-streamed response's too
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
    // Each choice has its own parser (and call ids of its own: the seed's stream for it).
    std::function<std::unique_ptr<ChatOutput>(int32_t)> make_chat;
    if (kind == ApiKind::kChat) {
      const uint64_t seed = q->generation.seed.value_or(std::random_device{}());
      ChatOutputOptions parse = ChatOutputOptionsFor(info_.chat_template.get(), q->generation,
                                                     q->tools, seed ^ 0x9e3779b97f4a7c15ULL);
      ConstrainAfterReasoning(parse, q->generation.constraint);
      if (ChatOutput(parse).active()) {
        make_chat = [parse, seed](int32_t index) {
          ChatOutputOptions o = parse;
          o.seed = ChoiceSeed(seed, index) ^ 0x9e3779b97f4a7c15ULL;
          return std::make_unique<ChatOutput>(std::move(o));
        };
      }
    }
    absl::StatusOr<PromptOutput> prompt = PromptOutputOf(*q);
    if (!prompt.ok()) return Refused(*ex, prompt.status());
    auto generation = std::make_shared<Generation>(
        ex, q->stream, q->include_usage, q->generation.logprobs, std::move(meta),
        options_.on_rejected, std::move(make_chat), *std::move(prompt));
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
