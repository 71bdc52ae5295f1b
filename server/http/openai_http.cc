#include "server/http/openai_http.h"

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/common/request_log.h"
#include "server/http/http_status.h"
#include "server/http/openai_json.h"
#include "spdlog/spdlog.h"

namespace heavykv::server {
namespace {

// How often a waiting worker looks at its connection.
constexpr auto kPollSlice = std::chrono::milliseconds(50);
constexpr char kJson[] = "application/json";

// One request's deltas, queued by the engine's callback and taken by the HTTP worker. Shared by
// both, so a delta that arrives after the worker has given up touches live memory.
struct DeltaQueue {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<GenerationDelta> deltas;  // guarded by mu
};

// A submitted request as the worker sees it.
struct Running {
  std::shared_ptr<DeltaQueue> queue = std::make_shared<DeltaQueue>();
  std::shared_ptr<RequestHandle> handle;
  bool finished = false;   // the finished delta has been taken
  bool cancelled = false;  // Cancel() was called (the client went away, or a write failed)

  void Cancel() {
    if (!cancelled && !finished && handle) handle->Cancel();
    cancelled = true;
  }

  // Waits until deltas are queued and takes them all. Before each wait (at least every
  // kPollSlice, and on every call, however fast tokens come) it checks the connection and
  // cancels the request once the client has gone; the engine then still sends the finished
  // delta, which ends the wait.
  std::vector<GenerationDelta> Take() {
    std::vector<GenerationDelta> out;
    for (;;) {
      if (!cancelled && HttpServer::ClientClosed()) Cancel();
      std::unique_lock<std::mutex> lock(queue->mu);
      if (queue->cv.wait_for(lock, kPollSlice, [&] { return !queue->deltas.empty(); })) {
        out.swap(queue->deltas);
        break;
      }
    }
    if (out.back().finished) finished = true;
    return out;
  }
};

void SetError(httplib::Response& res, const absl::Status& status) {
  res.status = ToHttpError(status.code()).status;
  res.set_content(ErrorBody(status), kJson);
}

void SetJson(httplib::Response& res, const nlohmann::json& value) {
  res.status = 200;
  res.set_content(JsonText(value), kJson);
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

// The state of one streamed response, shared by the content provider and its releaser.
struct Stream {
  Running run;
  ResponseMeta meta;
  bool include_usage = false;
  LogprobsJson logprobs{ApiKind::kCompletion, false};
  std::vector<GenerationDelta> pending;  // taken before the stream started
  bool role_sent = false;
  bool done = false;

  // The events for `deltas`; sets `done` after the last one and [DONE]. Deltas taken together
  // go out as one chunk, as gRPC merges queued deltas into one message: a client that reads
  // slower than tokens come gets fewer, larger chunks instead of a growing backlog.
  std::string Events(const std::vector<GenerationDelta>& deltas) {
    std::string out;
    if (meta.kind == ApiKind::kChat && !role_sent) {
      out += SseEvent(StreamChunkJson(meta, "", std::nullopt, /*first=*/true, include_usage));
      role_sent = true;
    }
    std::string text;
    bool tokens = false;
    const GenerationDelta* last = nullptr;
    for (const GenerationDelta& d : deltas) {
      text += d.text;
      tokens |= !d.token_ids.empty();
      logprobs.Add(d);
      if (d.finished) last = &d;
    }
    // A token that ends inside a character has no text yet; with logprobs it still goes out.
    const bool content = !text.empty() || (tokens && logprobs.enabled());
    if (last != nullptr) LogFinished(meta.id, *last);
    const absl::Status failed = last != nullptr ? FinishStatus(*last) : absl::OkStatus();
    // The finish reason rides on the last chunk; a failed request's text goes out before its
    // error event.
    if (last != nullptr && failed.ok()) {
      out += SseEvent(StreamChunkJson(meta, text, OpenAiFinishReason(last->finish_reason), false,
                                      include_usage, logprobs.Take()));
    } else if (content) {
      out += SseEvent(
          StreamChunkJson(meta, text, std::nullopt, false, include_usage, logprobs.Take()));
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

class OpenAiFront {
 public:
  OpenAiFront(Engine* engine, const OpenAiHttpOptions& options,
              std::shared_ptr<const std::atomic<bool>> draining)
      : engine_(engine),
        options_(options),
        draining_(std::move(draining)),
        info_(engine->Info()),
        served_{options.model_name, info_.max_new_tokens_limit},
        created_(absl::ToUnixSeconds(absl::Now())) {}

  HttpServer::Routes Routes(std::shared_ptr<OpenAiFront> self) const {
    HttpServer::Routes routes;
    const auto bind = [self](void (OpenAiFront::*method)(const httplib::Request&,
                                                         httplib::Response&)) {
      return [self, method](const httplib::Request& req, httplib::Response& res) {
        ((*self).*method)(req, res);
      };
    };
    routes.Add("/v1/completions", "POST", bind(&OpenAiFront::Completions));
    routes.Add("/v1/chat/completions", "POST", bind(&OpenAiFront::ChatCompletions));
    routes.Add("/v1/models", "GET", bind(&OpenAiFront::Models));
    routes.Add("/health", "GET", bind(&OpenAiFront::Health));
    routes.Add("/tokenize", "POST", bind(&OpenAiFront::Tokenize));
    routes.Add("/detokenize", "POST", bind(&OpenAiFront::Detokenize));
    return routes;
  }

 private:
  // OK when no key is needed or the request carries a listed one.
  bool Authorized(const httplib::Request& req, httplib::Response& res) const {
    if (options_.api_keys == nullptr) return true;
    absl::Status s = options_.api_keys->Check(req.get_header_value("Authorization"));
    if (s.ok()) return true;
    spdlog::info("HTTP {} refused from {}: {}", req.path, req.remote_addr, std::string(s.message()));
    if (options_.on_rejected) options_.on_rejected(s.code());
    SetError(res, WithErrorCode(s, "invalid_api_key"));
    res.set_header("WWW-Authenticate", "Bearer");
    return false;
  }

  std::string ClientOf(const httplib::Request& req) const {
    if (options_.api_keys != nullptr) {
      return absl::StrCat("key:",
                          std::hash<std::string>{}(req.get_header_value("Authorization")));
    }
    return absl::StrCat("http:", req.remote_addr, ":", req.remote_port);
  }

  void Refused(httplib::Response& res, const absl::Status& s) const {
    if (options_.on_rejected) options_.on_rejected(s.code());
    SetError(res, s);
  }

  void Completions(const httplib::Request& req, httplib::Response& res) {
    Generate(ApiKind::kCompletion, req, res);
  }
  void ChatCompletions(const httplib::Request& req, httplib::Response& res) {
    Generate(ApiKind::kChat, req, res);
  }

  void Generate(ApiKind kind, const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    absl::StatusOr<OpenAiRequest> q = ParseGenerationBody(kind, req.body, served_);
    if (!q.ok()) return Refused(res, q.status());
    ResponseMeta meta{kind,
                      absl::StrCat(kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-",
                                   next_id_.fetch_add(1)),
                      absl::ToUnixSeconds(absl::Now()), options_.model_name};
    q->generation.request_id = meta.id;
    q->generation.client = ClientOf(req);
    // Cached prompt prefixes stay with their API key (ClientOf names it when keys are on).
    if (options_.api_keys != nullptr) q->generation.tenant = q->generation.client;

    auto stream = std::make_shared<Stream>();
    Running& run = stream->run;
    absl::StatusOr<std::shared_ptr<RequestHandle>> handle = engine_->Submit(
        q->generation, [queue = run.queue](const GenerationDelta& d) {
          std::lock_guard<std::mutex> lock(queue->mu);
          queue->deltas.push_back(d);
          queue->cv.notify_all();
        });
    if (!handle.ok()) return Refused(res, handle.status());
    run.handle = *std::move(handle);

    // No byte goes out before the first delta, so a refusal after tokenizing keeps its status.
    std::vector<GenerationDelta> batch = run.Take();
    if (run.finished && batch.back().finish_reason == "rejected") {
      spdlog::info("request {} rejected: {}", meta.id, batch.back().status.ToString());
      return Refused(res, batch.back().status);
    }
    LogprobsJson logprobs(kind, q->generation.logprobs);
    if (!q->stream) {
      std::string text;
      for (;;) {
        for (const GenerationDelta& d : batch) {
          text += d.text;
          logprobs.Add(d);
        }
        if (run.finished) break;
        batch = run.Take();
      }
      const GenerationDelta& last = batch.back();
      LogFinished(meta.id, last);
      if (absl::Status s = FinishStatus(last); !s.ok()) return SetError(res, s);
      return SetJson(res, ResponseJson(meta, text, last, logprobs.Take()));
    }

    stream->meta = std::move(meta);
    stream->include_usage = q->include_usage;
    stream->logprobs = std::move(logprobs);
    stream->pending = std::move(batch);
    res.status = 200;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [stream](size_t, httplib::DataSink& sink) {
          if (stream->done) {
            sink.done();
            return true;
          }
          std::vector<GenerationDelta> deltas =
              stream->pending.empty() ? stream->run.Take() : std::move(stream->pending);
          stream->pending.clear();
          const std::string events = stream->Events(deltas);
          // A client that went away or stopped reading: stop the generation.
          if (stream->run.cancelled ||
              (!events.empty() && !sink.write(events.data(), events.size()))) {
            stream->run.Cancel();
            return false;
          }
          return true;  // an empty write would end the stream: the next call waits instead
        },
        [stream](bool) { stream->run.Cancel(); });  // ended early (server stopping): free pages
  }

  void Models(const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    SetJson(res, ModelsJson(options_.model_name, created_, info_.context_length));
  }

  void Health(const httplib::Request&, httplib::Response& res) {
    if (draining_->load()) {
      return SetError(res, absl::UnavailableError("the server is draining; retry elsewhere"));
    }
    SetJson(res, nlohmann::json::object());
  }

  void Tokenize(const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    absl::StatusOr<TokenizeBody> q = ParseTokenizeBody(req.body, served_);
    if (!q.ok()) return SetError(res, q.status());
    absl::StatusOr<std::vector<int32_t>> ids =
        q->messages ? engine_->TokenizeChat(*q->messages, q->add_generation_prompt)
                    : engine_->Tokenize(q->prompt, q->add_special_tokens);
    if (!ids.ok()) return SetError(res, WithParam(ids.status(), q->messages ? "messages" : "prompt"));
    SetJson(res, {{"count", ids->size()},
                  {"max_model_len", info_.context_length},
                  {"tokens", *ids}});
  }

  void Detokenize(const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    absl::StatusOr<std::vector<int32_t>> ids = ParseDetokenizeBody(req.body, served_);
    if (!ids.ok()) return SetError(res, ids.status());
    absl::StatusOr<std::string> text = engine_->Detokenize(*ids, /*skip_special_tokens=*/false);
    if (!text.ok()) return SetError(res, WithParam(text.status(), "tokens"));
    SetJson(res, {{"prompt", *text}});
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
  http.threads = options.threads;
  http.read_timeout = absl::Seconds(10);
  http.write_timeout = absl::Seconds(30);
  http.keep_alive_max_requests = 100;
  http.keep_alive_timeout = absl::Seconds(5);
  http.max_head_bytes = 16 << 10;
  // A prompt at the engine's limits, JSON-escaped (at most 6 bytes a byte) or as token ids (at
  // most 11 digits and a comma each), plus room for the other fields and a chat's structure.
  http.max_body_bytes = size_t(64 << 10) + 6 * size_t(info.max_prompt_bytes) +
                        12 * size_t(info.max_prompt_tokens);
  http.error_body = [limit = http.max_body_bytes](int status, httplib::Response& res) {
    absl::Status s;
    switch (status) {
      case 404:
        s = absl::NotFoundError(
            "no such route: POST /v1/completions, /v1/chat/completions, /tokenize, /detokenize; "
            "GET /v1/models, /health");
        break;
      case 405:
        s = absl::InvalidArgumentError("this route does not take that method (see Allow)");
        break;
      case 413:
        s = absl::InvalidArgumentError(
            absl::StrCat("the request body is over ", limit, " bytes, more than any prompt "
                         "this server takes"));
        break;
      case 500:
        s = absl::InternalError("the request failed inside the server");
        break;
      default:
        s = absl::InvalidArgumentError("malformed HTTP request");
    }
    res.set_content(ErrorBody(s), kJson);
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
