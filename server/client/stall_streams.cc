#include "server/client/stall_streams.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "heavykv/v1/generation.grpc.pb.h"
#include "server/client/bench_http.h"
#include "server/flags/cli_flags.h"

namespace heavykv::cli {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr auto kOpenTimeout = 60s;

// The /v1/completions body of `request` with its logprobs (the legacy field: the number of top
// tokens), which bench's measured requests do not send.
std::string StallBody(const v1::GenerateRequest& request) {
  nlohmann::json body = nlohmann::json::parse(CompletionBody(request));
  if (request.logprobs()) body["logprobs"] = request.top_logprobs();
  return body.dump();
}

}  // namespace

absl::StatusOr<std::unique_ptr<StallStreams>> StallStreams::Reference(const StallOptions& o) {
  std::unique_ptr<StallStreams> s(new StallStreams(o));
  s->reference_ = s->RunOne(0ms);
  if (!s->reference_.error.empty() || s->reference_.cancelled) {
    const StallOutcome& r = s->reference_;
    return absl::FailedPreconditionError(
        absl::StrCat("the reference request of the stalled streams failed: ",
                     r.cancelled ? "cancelled" : r.error, r.message.empty() ? "" : ": ", r.message,
                     " (does the server accept --stall-max-tokens?)"));
  }
  return s;
}

StallOutcome StallStreams::RunOne(std::chrono::milliseconds pause) {
  StallOutcome out;
  Clock::time_point resumed = Clock::now();
  bool counted = false;
  // After the read_first-th event: stop reading for `pause` (the caller's thread sleeps, so
  // nothing reads the connection).
  const auto after_event = [&](int64_t events) {
    if (pause.count() == 0 || out.stalled || events < options_.read_first) return;
    out.stalled = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++paused_;
      counted = true;
    }
    paused_cv_.notify_all();
    std::this_thread::sleep_for(pause);
    resumed = Clock::now();
  };
  if (!options_.http_url.empty()) {
    httplib::Client client(options_.http_url);
    client.set_tcp_nodelay(true);
    client.set_read_timeout(3600, 0);
    const StreamTiming t =
        StreamCompletion(client, StallBody(options_.request), options_.conn.api_key, after_event);
    out.text = t.text;
    out.error = t.error;
    out.tokens = t.completion_tokens;
    out.cancelled = t.finish_reason == "abort";
  } else {
    ConnectionFlags conn = options_.conn;  // Connect may fill in the key: a copy per thread
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        Connect(&conn, /*own_connection=*/true, options_.window_bytes);
    if (!channel.ok()) {
      out.error = channel.status().ToString();
    } else {
      std::unique_ptr<v1::Generation::Stub> stub = v1::Generation::NewStub(*channel);
      grpc::ClientContext context;
      Authorize(options_.conn, &context);
      auto reader = stub->Generate(&context, options_.request);
      int64_t events = 0;
      for (v1::GenerateResponse m; reader->Read(&m);) {
        out.text += m.text();
        out.tokens += m.token_ids_size();
        if (m.finish_reason() == v1::FINISH_REASON_CANCELLED) out.cancelled = true;
        if (m.token_ids_size() > 0) after_event(++events);
      }
      const grpc::Status status = reader->Finish();
      if (status.error_code() == grpc::StatusCode::CANCELLED) out.cancelled = true;
      if (!status.ok()) {
        out.error = StatusCodeName(status.error_code());
        out.message = status.error_message();
      }
    }
  }
  if (out.stalled)
    out.resume_seconds = std::chrono::duration<double>(Clock::now() - resumed).count();
  if (pause.count() > 0 && !counted) {  // ended before its pause: nothing to wait for
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++paused_;
    }
    paused_cv_.notify_all();
  }
  return out;
}

void StallStreams::Open() {
  for (int i = 0; i < options_.streams; ++i) {
    threads_.emplace_back([this] {
      StallOutcome out = RunOne(options_.stall);
      std::lock_guard<std::mutex> lock(mu_);
      outcomes_.push_back(std::move(out));
    });
  }
  std::unique_lock<std::mutex> lock(mu_);
  paused_cv_.wait_for(lock, kOpenTimeout, [&] { return paused_ >= options_.streams; });
}

void StallStreams::Finish() {
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

namespace {

struct Tally {
  int stalled = 0, matched = 0, differed = 0, cancelled = 0, failed = 0;
  std::map<std::string, int64_t> errors;
  std::vector<double> resume;  // seconds, sorted
};

Tally Count(const std::vector<StallOutcome>& outcomes, const std::string& reference) {
  Tally t;
  for (const StallOutcome& o : outcomes) {
    t.stalled += o.stalled;
    if (o.stalled) t.resume.push_back(o.resume_seconds);
    if (o.cancelled) {
      ++t.cancelled;
    } else if (!o.error.empty()) {
      ++t.failed;
      ++t.errors[o.error];
    } else if (o.text == reference) {
      ++t.matched;
    } else {
      ++t.differed;
    }
  }
  std::sort(t.resume.begin(), t.resume.end());
  return t;
}

}  // namespace

bool StallStreams::all_matched() const {
  return Count(outcomes_, reference_.text).matched == options_.streams;
}

nlohmann::ordered_json StallStreams::Json() const {
  const Tally t = Count(outcomes_, reference_.text);
  return {{"stall",
           {{"streams", options_.streams},
            {"api", options_.http_url.empty() ? "grpc" : "http"},
            {"stall_seconds", Rounded(std::chrono::duration<double>(options_.stall).count(), 3)},
            {"read_first", options_.read_first},
            {"max_tokens", options_.request.max_new_tokens()},
            {"top_logprobs", options_.request.top_logprobs()},
            {"reference_tokens", reference_.tokens},
            {"stalled", t.stalled},
            {"matched", t.matched},
            {"differed", t.differed},
            {"cancelled", t.cancelled},
            {"failed", t.failed},
            {"errors", t.errors},
            {"resume_ms",
             {{"p50", Rounded(1000 * Percentile(t.resume, 50), 3)},
              {"max", Rounded(1000 * (t.resume.empty() ? 0 : t.resume.back()), 3)}}}}}};
}

std::string StallStreams::Table() const {
  const Tally t = Count(outcomes_, reference_.text);
  std::vector<std::string> why;
  for (const auto& [k, n] : t.errors) why.push_back(absl::StrCat(k, " ", n));
  std::string out = absl::StrFormat(
      "stalled streams %d over %s (%d tokens, top %d logprobs), %d paused %.1f s after %d "
      "events\n",
      options_.streams, options_.http_url.empty() ? "gRPC" : "HTTP",
      options_.request.max_new_tokens(), options_.request.top_logprobs(), t.stalled,
      std::chrono::duration<double>(options_.stall).count(), options_.read_first);
  absl::StrAppendFormat(&out,
                        "                %d matched the reference (%d tokens), %d differed, %d "
                        "cancelled, %d failed%s%s; resumed to the end in p50 %.1f ms, max %.1f "
                        "ms\n",
                        t.matched, reference_.tokens, t.differed, t.cancelled, t.failed,
                        why.empty() ? "" : ": ", absl::StrJoin(why, ", "),
                        1000 * Percentile(t.resume, 50),
                        1000 * (t.resume.empty() ? 0 : t.resume.back()));
  return out;
}

}  // namespace heavykv::cli
