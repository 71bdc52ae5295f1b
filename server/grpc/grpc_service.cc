#include "server/grpc/grpc_service.h"

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/serving/request_validation.h"
#include "server/common/request_log.h"
#include "server/grpc/grpc_status.h"
#include "server/grpc/proto_convert.h"
#include "spdlog/spdlog.h"

namespace heavykv::server {
namespace {

// Bytes of deltas merged into one pending message, at most, before the request is held
// (RequestHandle::Hold): a client that does not read keeps the server's memory for its stream
// to about twice this (the message in flight and the next), whatever it asked for.
constexpr size_t kHoldBytes = 32 << 10;

// The size of `d` as a GenerateResponse, near enough to bound memory with.
size_t DeltaBytes(const GenerationDelta& d) {
  size_t n = d.text.size() + 6 * d.token_ids.size() + 5 * d.logprobs.size();
  for (const auto& step : d.top_logprobs) n += 4 + 11 * step.size();
  return n;
}

// One Generate call. Deltas arrive on the engine thread (OnDelta) and are merged into `pending_`
// while a write is in flight; gRPC threads drive OnWriteDone / OnCancel / OnDone. Everything is
// guarded by mu_.
//
// Backpressure: once kHoldBytes are merged behind a write that has not completed, the request is
// held (the engine stops decoding it, so nothing more is merged) until that write completes and
// the next one takes the pending message. A request held longer than the engine's stall timeout
// is cancelled by the engine; its write never completing, the call is then cancelled
// (TryCancel), which ends the write and the call.
//
// Lifetime: three references: the call (dropped in OnDone), the engine (dropped with the
// finished delta, which the engine sends exactly once) and Start() itself; the last one out
// deletes the reactor, so the engine never calls into a deleted reactor.
class GenerateReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  GenerateReactor(grpc::CallbackServerContext* context, std::string request_id,
                  const RejectionObserver* on_rejected)
      : context_(context),
        request_id_(std::move(request_id)),
        log_id_(EscapedPrefix(request_id_, kMaxRequestIdBytes)),
        on_rejected_(on_rejected) {}

  void Start(Engine* engine, absl::StatusOr<GenerationRequest> request) {
    absl::StatusOr<std::shared_ptr<RequestHandle>> handle =
        request.ok() ? engine->Submit(*request, [this](const GenerationDelta& d) { OnDelta(d); })
                     : request.status();
    if (!handle.ok()) {
      spdlog::info("request {} rejected: {}", log_id_, handle.status().ToString());
      if (on_rejected_ != nullptr && *on_rejected_) (*on_rejected_)(handle.status().code());
      {
        std::lock_guard<std::mutex> lock(mu_);
        finish_called_ = true;
        Finish(ToGrpcStatus(handle.status()));
      }
      Unref();  // the engine's reference: it will never call
    } else {
      std::lock_guard<std::mutex> lock(mu_);
      handle_ = *std::move(handle);
      if (cancel_requested_) handle_->Cancel();
      if (held_) handle_->Hold(true);
    }
    Unref();
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (cancelling_) return;  // OnDelta finishes the call once TryCancel has returned
    if (!ok) {  // the client is gone: stop the engine work, end the call
      CancelLocked();
      if (!finish_called_) {
        finish_called_ = true;
        Finish(ToGrpcStatus(absl::CancelledError("the stream was closed")));
      }
      return;
    }
    WriteLocked();
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    CancelLocked();
  }

  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      CancelLocked();  // OnDone before the engine finished: free the pages now
    }
    Unref();
  }

 private:
  void OnDelta(const GenerationDelta& d) {
    bool cancel_call = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Deltas of one choice merge into one message; another choice's starts the next (a
      // message carries one index).
      if (pending_.empty() || pending_.back().message.index() != d.index ||
          pending_.back().message.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
        pending_.emplace_back();
      }
      AppendDelta(d, &pending_.back().message);
      pending_.back().bytes += DeltaBytes(d);
      pending_bytes_ += DeltaBytes(d);
      has_pending_ = true;
      if (d.finished) {
        engine_done_ = true;
        if (d.finish_reason == "rejected") {  // failed a check after tokenizing: as if refused
          status_ = ToGrpcStatus(d.status);
          has_pending_ = false;
          pending_.clear();
          pending_bytes_ = 0;
          spdlog::info("request {} rejected: {}", log_id_, d.status.ToString());
          if (on_rejected_ != nullptr && *on_rejected_) (*on_rejected_)(d.status.code());
        } else {
          // d.status is OK but for a request its deadline stopped: that call ends
          // DEADLINE_EXCEEDED, as the client's own timer would end it, whichever comes first.
          status_ = ToGrpcStatus(d.finish_reason == "error"
                                     ? absl::InternalError("generation failed: " + d.error)
                                     : d.status);
          LogFinished(log_id_, d);
        }
      }
      if (!writing_ && !finish_called_) {
        WriteLocked();
      } else if (writing_ && !held_ && !d.finished && pending_bytes_ >= kHoldBytes) {
        held_ = true;  // the client is not keeping up: stop decoding until the write completes
        if (handle_) handle_->Hold(true);
      }
      // Finished while held (the engine's stall timeout): the client reads nothing, so the
      // write in flight would never complete and the call never end. Cancelling the call fails
      // the write. TryCancel may run callbacks inline, so it is called without mu_, and no
      // Finish (so no OnDone, which would end context_) happens until it returns.
      cancel_call = d.finished && held_ && writing_;
      cancelling_ = cancel_call;
    }
    if (cancel_call) {
      context_->TryCancel();
      std::lock_guard<std::mutex> lock(mu_);
      cancelling_ = false;
      if (!writing_ && !finish_called_) {  // the write failed inline
        finish_called_ = true;
        Finish(status_);
      }
    }
    if (d.finished) Unref();
  }

  // Starts the next write (all queued deltas merged into one message), or finishes the call
  // once the last delta is written.
  void WriteLocked() {
    if (has_pending_) {
      current_ = std::move(pending_.front().message);
      pending_bytes_ -= pending_.front().bytes;
      pending_.pop_front();
      has_pending_ = !pending_.empty();
      if (held_) {  // the client read the last message: decode on
        held_ = false;
        if (handle_) handle_->Hold(false);
      }
      // The id goes out once, in the first message: a client that sent a long one is not sent it
      // back with every token.
      if (!id_sent_) current_.set_request_id(request_id_);
      id_sent_ = true;
      writing_ = true;
      StartWrite(&current_);
    } else if (engine_done_ && !finish_called_) {
      finish_called_ = true;
      Finish(status_);
    }
  }

  void CancelLocked() {
    if (engine_done_) return;
    if (handle_) {
      handle_->Cancel();
    } else {
      cancel_requested_ = true;
    }
  }

  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  grpc::CallbackServerContext* const context_;  // the call's (valid until OnDone)
  const std::string request_id_;
  const std::string log_id_;  // escaped: a client's id cannot forge log lines
  const RejectionObserver* on_rejected_;  // the service's (it outlives every call), or null
  std::atomic<int> refs_ = 3;
  std::mutex mu_;
  std::shared_ptr<RequestHandle> handle_;
  // Messages not yet written, each one choice's merged deltas; current_ is in flight while
  // writing_.
  struct Pending {
    v1::GenerateResponse message;
    size_t bytes = 0;  // DeltaBytes merged into it
  };
  std::deque<Pending> pending_;
  v1::GenerateResponse current_;
  grpc::Status status_;
  bool has_pending_ = false, writing_ = false, engine_done_ = false, finish_called_ = false;
  bool cancel_requested_ = false, id_sent_ = false;
  size_t pending_bytes_ = 0;  // DeltaBytes of pending_, all messages
  bool held_ = false;         // the request is held (see the class comment)
  bool cancelling_ = false;   // OnDelta is in TryCancel: nothing may Finish the call
};

// One Tokenize call: the engine's tokenizer thread does the work; a client that cancels stops it.
class TokenizeReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit TokenizeReactor(v1::TokenizeResponse* response) : response_(response) {}

  void Start(Engine* engine, const std::string& text, bool add_special, absl::Time deadline) {
    engine->TokenizeAsync(text, add_special, cancelled_, deadline,
                          [this](absl::StatusOr<std::vector<int32_t>> ids) {
                            if (ids.ok()) {
                              for (int32_t id : *ids) response_->add_token_ids(id);
                            }
                            Finish(ToGrpcStatus(ids.status()));
                          });
  }
  void OnCancel() override { cancelled_->store(true); }
  void OnDone() override { delete this; }

 private:
  v1::TokenizeResponse* response_;
  std::shared_ptr<std::atomic<bool>> cancelled_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace

GenerationService::GenerationService(Engine* engine, ServiceDefaults defaults,
                                     RejectionObserver on_rejected,
                                     CallAuthenticator authenticate)
    : engine_(engine),
      defaults_(std::move(defaults)),
      on_rejected_(std::move(on_rejected)),
      authenticate_(std::move(authenticate)) {}

absl::Status GenerationService::Authenticate(const grpc::CallbackServerContext& context,
                                             std::string_view method) {
  if (!authenticate_) return absl::OkStatus();
  absl::Status s = authenticate_(context, method);
  if (!s.ok() && on_rejected_) on_rejected_(s.code());
  return s;
}

grpc::ServerUnaryReactor* GenerationService::Refuse(grpc::CallbackServerContext* context,
                                                    std::string_view method) {
  absl::Status s = Authenticate(*context, method);
  if (s.ok()) return nullptr;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();  // once per call: it resets
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

std::string GenerationService::ClientOf(const grpc::CallbackServerContext& context) const {
  if (authenticate_) {  // the call passed the key check: its authorization names a listed key
    const auto& metadata = context.client_metadata();
    auto it = metadata.find("authorization");
    if (it != metadata.end()) {
      return absl::StrCat("key:", std::hash<std::string_view>{}(
                                      std::string_view(it->second.data(), it->second.size())));
    }
  }
  return context.peer();
}

template <typename Request>
grpc::ServerWriteReactor<v1::GenerateResponse>* GenerationService::StartGeneration(
    grpc::CallbackServerContext* context, const Request& request, std::string_view method) {
  std::string id = request.request_id();
  if (id.empty()) id = absl::StrCat("req-", next_request_.fetch_add(1));
  if (absl::Status s = Authenticate(*context, method); !s.ok()) {
    auto* reactor = new GenerateReactor(context, std::move(id), nullptr);
    reactor->Start(engine_, s);  // finishes the call with `s`; the engine is not called
    return reactor;
  }
  absl::StatusOr<GenerationRequest> r = FromProto(request);
  if (r.ok()) {
    r->request_id = id;
    r->client = ClientOf(*context);
    if (authenticate_) r->tenant = r->client;  // cached prefixes stay with their API key
    if (context->deadline() != std::chrono::system_clock::time_point::max()) {
      r->deadline = absl::FromChrono(context->deadline());
    }
  }
  auto* reactor = new GenerateReactor(context, std::move(id), &on_rejected_);
  reactor->Start(engine_, std::move(r));
  return reactor;
}

grpc::ServerWriteReactor<v1::GenerateResponse>* GenerationService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  return StartGeneration(context, *request, "Generate");
}

grpc::ServerWriteReactor<v1::GenerateResponse>* GenerationService::Chat(
    grpc::CallbackServerContext* context, const v1::ChatRequest* request) {
  return StartGeneration(context, *request, "Chat");
}

grpc::ServerUnaryReactor* GenerationService::Tokenize(grpc::CallbackServerContext* context,
                                                      const v1::TokenizeRequest* request,
                                                      v1::TokenizeResponse* response) {
  if (grpc::ServerUnaryReactor* refused = Refuse(context, "Tokenize")) return refused;
  auto* reactor = new TokenizeReactor(response);
  const absl::Time deadline = context->deadline() == std::chrono::system_clock::time_point::max()
                                  ? absl::InfiniteFuture()
                                  : absl::FromChrono(context->deadline());
  reactor->Start(engine_, request->text(),
                 !request->has_add_special_tokens() || request->add_special_tokens(), deadline);
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::GetModelInfo(grpc::CallbackServerContext* context,
                                                          const v1::GetModelInfoRequest*,
                                                          v1::ModelInfo* response) {
  if (grpc::ServerUnaryReactor* refused = Refuse(context, "GetModelInfo")) return refused;
  ToProto(engine_->Info(), response);
  response->set_default_policy(defaults_.policy);
  response->set_default_budget(defaults_.budget);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::GetCacheStats(grpc::CallbackServerContext* context,
                                                           const v1::GetCacheStatsRequest*,
                                                           v1::CacheStats* response) {
  if (grpc::ServerUnaryReactor* refused = Refuse(context, "GetCacheStats")) return refused;
  ToProto(engine_->Stats(), response);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace heavykv::server
