// heavykv bench: a closed-loop load test of a running `heavykv serve`. C client threads each
// send one streamed request at a time until N have been sent. Prompts are L random token ids
// (BOS first); each asks for G new tokens with ignore_eos, so every request does the same work.
// Reports throughput, TTFT and inter-token latency percentiles, the most sequences the server
// ran at once (GetCacheStats polled every 10 ms), and failed requests by status code.
// --flood-streams F adds a second client, on its own connection, that keeps F streams of the same
// requests (with --flood-max-tokens each) open all along: the figures are then those of a client
// sharing the server with a flood, which the scheduler's fair admission is there to protect.
// --http URL sends the measured requests to the OpenAI HTTP API instead (POST /v1/completions,
// streamed; server/client/bench_http.h), the same prompts and fields, so that the HTTP front can be
// compared with gRPC; --server still answers GetModelInfo and the GetCacheStats polls.
// --slow-connections N (with --http) holds N idle connections to the HTTP front meanwhile (half a
// request header each, or nothing: --slow-kind; as --slow-sources clients), replacing each one
// the server closes, while a probe (another client) asks GET /v1/models every
// --probe-interval-ms; --server-pid P samples the server's RSS and threads before, during and
// after (server/client/front_load.h). N = 0 runs the probe alone, the figure of an idle front.
// Issue 41's loads, beside the measured requests: --overflow-connections N (with --http) opens N
// connections, --overflow-concurrency at a time, that each send one completion (plain and
// streamed in turn) and 200 KB more, then close (server/client/overflow_load.h), while the probe
// runs (--probe-path /health); --stall-streams N opens N greedy streams with bulky logprobs
// whose clients stop reading for --stall-seconds, then read to the end, each checked against the
// same request read at once (server/client/stall_streams.h); gRPC, or HTTP with --http.
// --metrics-url scrapes the server's open connections, sequences and KV pages once it settles.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "heavykv/v1/generation.grpc.pb.h"
#include "server/cli/commands.h"
#include "server/client/bench_http.h"
#include "server/client/client_request.h"
#include "server/client/front_load.h"
#include "server/client/metrics_scrape.h"
#include "server/client/stall_streams.h"
#include "server/flags/cli_flags.h"

namespace heavykv::cli {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double>(t1 - t0).count();
}

struct Results {
  std::mutex mu;
  std::vector<double> ttft, itl, e2e;
  int64_t completion_tokens = 0, prompt_tokens = 0, ok = 0;
  std::map<std::string, int64_t> errors;  // status code name -> count
};

// Adds one finished stream, which took `e2e` seconds in all.
void Record(const StreamTiming& t, double e2e, Results& out) {
  std::lock_guard<std::mutex> lock(out.mu);
  if (!t.error.empty()) {
    ++out.errors[t.error];
    return;
  }
  ++out.ok;
  out.completion_tokens += t.completion_tokens;
  out.prompt_tokens += t.prompt_tokens;
  if (t.ttft >= 0) out.ttft.push_back(t.ttft);
  out.itl.insert(out.itl.end(), t.itl.begin(), t.itl.end());
  out.e2e.push_back(e2e);
}

void RunOneHttp(httplib::Client& client, const ConnectionFlags& conn, const std::string& body,
                Results& out) {
  const Clock::time_point start = Clock::now();
  const StreamTiming t = StreamCompletion(client, body, conn.api_key);
  Record(t, SecondsSince(start, Clock::now()), out);
}

void RunOne(v1::Generation::Stub& stub, const ConnectionFlags& conn,
            const v1::GenerateRequest& request, Results& out) {
  grpc::ClientContext context;
  Authorize(conn, &context);
  const Clock::time_point start = Clock::now();
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub.Generate(&context, request);
  v1::GenerateResponse m;
  StreamTiming t;
  std::vector<double>& itl = t.itl;
  double& ttft = t.ttft;
  int64_t tokens = 0, prompt = 0;
  Clock::time_point last = start;
  while (reader->Read(&m)) {
    const Clock::time_point now = Clock::now();
    const int n = m.token_ids_size();
    if (n > 0) {
      if (ttft < 0) {
        ttft = SecondsSince(start, now);
        // Tokens that arrive merged in one message share the gap.
        for (int i = 1; i < n; ++i) itl.push_back(0);
      } else {
        for (int i = 0; i < n; ++i) itl.push_back(SecondsSince(last, now) / n);
      }
      last = now;
      tokens += n;
    }
    if (m.has_usage()) prompt = m.usage().prompt_tokens();
  }
  const grpc::Status status = reader->Finish();
  if (!status.ok()) t.error = StatusCodeName(status.error_code());
  t.completion_tokens = tokens;
  t.prompt_tokens = prompt;
  Record(t, SecondsSince(start, Clock::now()), out);
}

// A request longer than the model's context streams past it only with a window policy; one
// that sets no policy gets window with a budget of 64 tokens (or half the context).
void StreamPastContext(const v1::ModelInfo& info, v1::GenerateRequest* r) {
  if (r->prompt_token_ids().ids_size() + r->max_new_tokens() <= info.context_length() ||
      r->kv().has_policy()) {
    return;
  }
  r->mutable_kv()->set_policy("window");
  r->mutable_kv()->set_budget_tokens(std::min(64, info.context_length() / 2));
}

// The two requests overflow connections send in turn: `r` as a plain completion, and streamed
// with `max_tokens` new tokens (past the context where the server allows it).
std::vector<std::string> OverflowRequests(const v1::ModelInfo& info, v1::GenerateRequest r,
                                          int64_t max_tokens, const std::string& api_key) {
  std::vector<std::string> out;
  for (const bool stream : {false, true}) {
    if (stream) {
      r.set_max_new_tokens(static_cast<int32_t>(max_tokens));
      StreamPastContext(info, &r);
    }
    nlohmann::json body = nlohmann::json::parse(CompletionBody(r));
    body["stream"] = stream;
    if (!stream) body.erase("stream_options");
    const std::string json = body.dump();
    out.push_back(absl::StrCat(
        "POST /v1/completions HTTP/1.1\r\nHost: heavykv-bench\r\n",
        api_key.empty() ? "" : absl::StrCat("Authorization: Bearer ", api_key, "\r\n"),
        "Content-Type: application/json\r\nContent-Length: ", json.size(), "\r\n\r\n", json));
  }
  return out;
}

void Progress(int64_t done, int64_t total) {
  constexpr int kWidth = 40;
  const int filled = total > 0 ? static_cast<int>(kWidth * done / total) : kWidth;
  std::printf("\r[%s%s] %lld/%lld", std::string(filled, '#').c_str(),
              std::string(kWidth - filled, ' ').c_str(), static_cast<long long>(done),
              static_cast<long long>(total));
  std::fflush(stdout);
}

}  // namespace

int BenchCommand(int argc, char** argv) {
  ConnectionFlags conn;
  int64_t concurrency = 8, requests = 64, prompt_tokens = 32, seed = 1;
  int64_t flood_streams = 0, flood_max_tokens = 512;
  bool json = false;
  std::string http_url;
  FrontLoadOptions front;
  int64_t slow_connections = -1, slow_sources = 1, probe_interval_ms = 100, server_pid = 0;
  int64_t overflow_connections = 0, overflow_concurrency = 256, overflow_max_tokens = 0;
  int64_t overflow_hold_ms = 0, stall_streams = 0, stall_max_tokens = 2000, stall_read_events = 2;
  int64_t stall_window_kb = 64;
  double stall_seconds = 120, stall_settle_seconds = 5;
  RequestFlags rf;
  rf.ignore_eos = true;
  FlagSet flags("bench",
                "heavykv bench --server ADDR --concurrency C --requests N "
                "--prompt-tokens L --max-tokens G [--policy P --kv-budget B] [--json]");
  AddConnectionFlags(flags, &conn);
  flags.Int("concurrency", &concurrency, "requests in flight at once");
  flags.Int("requests", &requests,
            "requests in all (0: none, with --overflow-connections or --stall-streams)");
  flags.Int("prompt-tokens", &prompt_tokens, "prompt length in tokens, BOS included");
  flags.Int("prompt-seed", &seed, "seed of the random prompts");
  flags.Bool("json", &json, "print one JSON object instead of the table");
  flags.Int("flood-streams", &flood_streams,
            "streams another client (its own connection) keeps open meanwhile; 0 = none");
  flags.Int("flood-max-tokens", &flood_max_tokens, "new tokens of each flood request");
  flags.String("http", &http_url,
               "send the measured requests to this OpenAI HTTP API (http://host:port) instead "
               "of gRPC; --server still gives the model info and cache stats");
  flags.Int("slow-connections", &slow_connections,
            "with --http: idle connections held open to its server meanwhile, each replaced when "
            "the server closes it, and a probe of GET /v1/models; 0 = the probe alone, -1 = "
            "neither");
  flags.String("slow-kind", &front.slow_kind,
               "what each slow connection sends: half-header (half a POST's header) or silent");
  flags.Int("slow-sources", &slow_sources,
            "clients the slow connections come from: K > 1 binds them to 127.0.0.2..127.0.0.(K+1) "
            "and the probe to 127.0.0.1 (loopback servers only)");
  flags.Int("probe-interval-ms", &probe_interval_ms,
            "with --slow-connections: a probe opens a connection and asks GET /v1/models this "
            "often (timeout 30 s); 0 = no probe");
  flags.String("probe-path", &front.probe_path, "what the probe GETs (e.g. /health)");
  flags.Int("server-pid", &server_pid,
            "the server's process id: its RSS and threads before, at the peak and 1 s after");
  flags.Int("overflow-connections", &overflow_connections,
            "with --http: connections (from --slow-sources) that each send one completion, plain "
            "and streamed in turn, then 200 KB more, then close; the probe runs meanwhile and 3 s "
            "after; 0 = none");
  flags.Int("overflow-concurrency", &overflow_concurrency, "overflow connections open at once");
  flags.Int("overflow-max-tokens", &overflow_max_tokens,
            "new tokens of the streamed overflow requests (window policy past the context); 0 = "
            "what the context leaves after the prompt");
  flags.Int("overflow-hold-ms", &overflow_hold_ms,
            "an overflow connection waits this long for a response's first byte before closing");
  flags.String("metrics-url", &front.metrics_url,
               "the server's Prometheus page (http://127.0.0.1:9090/metrics): scraped after the "
               "load until open connections, running and waiting sequences and KV pages used are "
               "0 or --settle-seconds pass, and reported");
  flags.Double("settle-seconds", &front.settle_seconds,
               "with --metrics-url: the most seconds to wait for the server to be idle");
  flags.Int("stall-streams", &stall_streams,
            "greedy streams (gRPC, or --http) with 20 top logprobs a token whose clients read "
            "--stall-read-events events, stop reading for --stall-seconds, then read to the end; "
            "each text is checked against the same request read at once; 0 = none");
  flags.Double("stall-seconds", &stall_seconds, "how long the stalled streams stop reading");
  flags.Double("stall-settle-seconds", &stall_settle_seconds,
               "seconds between the stalled streams' last read and the start of the measured "
               "load (what they generate until the server holds them, or until the sockets' "
               "buffers fill, is not measured); with --metrics-url the most it waits: the load "
               "starts once heavykv_generation_tokens_total stands still for a second");
  flags.Int("stall-max-tokens", &stall_max_tokens,
            "new tokens of each stalled stream (window policy past the context)");
  flags.Int("stall-read-events", &stall_read_events, "events a stalled stream reads first");
  flags.Int("stall-window-kb", &stall_window_kb,
            "gRPC: each stalled call's HTTP/2 window in KiB (no BDP growth), so the server sees "
            "it stop after about that much; 0 = gRPC's own window, which grows to megabytes "
            "and swallows a short stream whole");
  AddRequestFlags(flags, &rf);
  if (std::optional<int> code = ParseOrExit(flags, argc, argv)) return *code;
  if (!http_url.empty() && rf.n > 1) {
    return Fail(absl::InvalidArgumentError(
        "--n above 1 is measured over gRPC only: bench --http reads one choice's stream"));
  }
  if ((slow_connections >= 0 || overflow_connections > 0) && http_url.empty()) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat(slow_connections >= 0 ? "--slow-connections" : "--overflow-connections",
                     " needs --http URL (its target)")));
  }
  if (overflow_connections < 0 || overflow_connections > 10000000 || overflow_concurrency < 1 ||
      overflow_concurrency > 65536 || overflow_max_tokens < 0 || overflow_max_tokens > INT32_MAX ||
      overflow_hold_ms < 0 || overflow_hold_ms > 3600000 || stall_streams < 0 ||
      stall_streams > 4096 || !(stall_seconds >= 0 && stall_seconds <= 86400) ||
      stall_max_tokens < 1 || stall_max_tokens > INT32_MAX || stall_read_events < 1 ||
      !(front.settle_seconds >= 0 && front.settle_seconds <= 3600)) {
    return Fail(absl::InvalidArgumentError(
        "--overflow-connections must be in [0, 10000000], --overflow-concurrency in [1, 65536], "
        "--overflow-hold-ms in [0, 3600000], --stall-streams in [0, 4096], --stall-seconds in "
        "[0, 86400], --stall-max-tokens and --stall-read-events at least 1, --settle-seconds in "
        "[0, 3600]"));
  }
  if (overflow_connections > 0 && slow_connections < 0) slow_connections = 0;  // the probe
  if (slow_connections < -1 || slow_connections > 1000000 || slow_sources < 1 ||
      slow_sources > 250 || probe_interval_ms < 0 || probe_interval_ms > 3600000 ||
      server_pid < 0 || server_pid > INT32_MAX) {
    return Fail(absl::InvalidArgumentError(
        "--slow-connections must be in [0, 1000000], --slow-sources in [1, 250], "
        "--probe-interval-ms in [0, 3600000], --server-pid a process id"));
  }
  front.http_url = http_url;
  front.slow_connections = static_cast<int>(slow_connections);
  front.slow_sources = static_cast<int>(slow_sources);
  front.probe_interval_ms = static_cast<int>(probe_interval_ms);
  front.api_key = conn.api_key;
  front.server_pid = static_cast<pid_t>(server_pid);
  front.other_sockets =
      static_cast<int>(std::min<int64_t>(concurrency, requests) + stall_streams) + 16;
  front.overflow_connections = static_cast<int>(overflow_connections);
  front.overflow_concurrency = static_cast<int>(overflow_concurrency);
  front.overflow_hold_ms = static_cast<int>(overflow_hold_ms);
  // With a load of issue 41's, the measured requests may be left out (--requests 0).
  const int64_t least_requests = overflow_connections > 0 || stall_streams > 0 ? 0 : 1;
  if (concurrency < 1 || requests < least_requests || prompt_tokens < 1 || flood_streams < 0 ||
      flood_max_tokens < 1) {
    return Fail(absl::InvalidArgumentError(
        "--concurrency, --requests (0 is allowed with --overflow-connections or "
        "--stall-streams), --prompt-tokens and --flood-max-tokens must be at least 1, "
        "--flood-streams at least 0"));
  }
  v1::GenerateRequest base;
  if (absl::Status s = FillRequest(flags, rf, &base); !s.ok()) return Fail(s);

  absl::StatusOr<std::shared_ptr<grpc::Channel>> connected = Connect(&conn);
  if (!connected.ok()) return Fail(connected.status());
  std::shared_ptr<grpc::Channel> channel = *std::move(connected);
  std::unique_ptr<v1::Generation::Stub> stub = v1::Generation::NewStub(channel);
  v1::ModelInfo info;
  {
    grpc::ClientContext context;
    Authorize(conn, &context);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Status s = stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &info);
    if (!s.ok()) {
      std::fprintf(stderr, "error: cannot reach %s: %s: %s\n", conn.address.c_str(),
                   StatusCodeName(s.error_code()).c_str(), s.error_message().c_str());
      return 1;
    }
  }
  // Random prompts, fixed by --prompt-seed; ids 3.. skip BOS/EOS and the <unk> of tok512.
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_int_distribution<int32_t> id(3, std::max(3, info.vocab_size() - 1));
  std::vector<v1::GenerateRequest> batch(std::max<int64_t>(requests, 1), base);
  for (size_t i = 0; i < batch.size(); ++i) {
    batch[i].set_request_id(absl::StrCat("bench-", i));
    v1::TokenIds* ids = batch[i].mutable_prompt_token_ids();
    ids->add_ids(1);
    for (int64_t t = 1; t < prompt_tokens; ++t) ids->add_ids(id(rng));
  }

  std::vector<std::string> bodies;  // --http: the same requests as JSON
  if (!http_url.empty()) {
    if (!httplib::Client(http_url).is_valid()) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--http ", http_url, " is not a URL like http://127.0.0.1:8000")));
    }
    for (const v1::GenerateRequest& r : batch) bodies.push_back(CompletionBody(r));
  }
  Results results;
  std::atomic<int64_t> next = 0, done = 0;
  std::atomic<bool> finished = false;

  if (overflow_connections > 0) {
    front.overflow_requests = OverflowRequests(
        info, batch[0],
        overflow_max_tokens > 0 ? overflow_max_tokens
                                : std::max<int64_t>(1, info.context_length() - prompt_tokens),
        conn.api_key);
  }
  std::unique_ptr<StallStreams> stalls;  // their reference runs before the server is sampled
  if (stall_streams > 0) {
    StallOptions so;
    so.streams = static_cast<int>(stall_streams);
    so.stall = std::chrono::milliseconds(std::llround(stall_seconds * 1000));
    so.read_first = static_cast<int>(stall_read_events);
    so.window_bytes = static_cast<int>(std::clamp<int64_t>(stall_window_kb, 0, 1 << 20) * 1024);
    so.request = batch[0];
    so.request.set_request_id("bench-stall");
    so.request.set_max_new_tokens(static_cast<int32_t>(stall_max_tokens));
    so.request.mutable_sampling()->set_temperature(0);
    so.request.set_logprobs(true);
    so.request.set_top_logprobs(20);
    StreamPastContext(info, &so.request);
    so.conn = conn;
    so.http_url = http_url;
    absl::StatusOr<std::unique_ptr<StallStreams>> reference = StallStreams::Reference(so);
    if (!reference.ok()) return Fail(reference.status());
    stalls = *std::move(reference);
  }
  std::unique_ptr<FrontLoad> front_load;  // the HTTP front's slow connections and probe
  if (front.slow_connections >= 0 || front.server_pid > 0 || !front.metrics_url.empty()) {
    absl::StatusOr<std::unique_ptr<FrontLoad>> started = FrontLoad::Start(front);
    if (!started.ok()) return Fail(started.status());
    front_load = *std::move(started);
  }
  if (stalls != nullptr) {
    stalls->Open();  // every stalled stream has stopped reading
    const auto settle_by =
        std::chrono::steady_clock::now() +
        std::chrono::milliseconds(std::llround(std::clamp(stall_settle_seconds, 0.0, 600.0) * 1000));
    if (front.metrics_url.empty()) {
      std::this_thread::sleep_until(settle_by);
    } else {  // settled: no token generated for a second (every stalled stream is held)
      double last = -1;
      for (int still = 0; still < 2 && std::chrono::steady_clock::now() < settle_by;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        absl::StatusOr<std::map<std::string, double>> m = ScrapeMetrics(front.metrics_url);
        const double now = m.ok() && m->count("heavykv_generation_tokens_total") > 0
                               ? m->at("heavykv_generation_tokens_total")
                               : -2;
        still = now == last ? still + 1 : 0;
        last = now;
      }
    }
  }
  // The flood: F streams on another connection, each sending one request after another until
  // the measured client is done, then cancelled.
  std::unique_ptr<v1::Generation::Stub> flood_stub;
  if (flood_streams > 0) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> own = Connect(&conn, /*own_connection=*/true);
    if (!own.ok()) return Fail(own.status());
    flood_stub = v1::Generation::NewStub(*own);
  }
  std::mutex flood_mu;
  std::vector<grpc::ClientContext*> flood_calls;  // in flight, for the final cancel
  std::vector<std::thread> flooders;
  for (int64_t f = 0; f < flood_streams; ++f) {
    flooders.emplace_back([&, f] {
      v1::GenerateRequest req = batch[f % batch.size()];
      req.set_max_new_tokens(static_cast<int32_t>(flood_max_tokens));
      req.set_request_id(absl::StrCat("flood-", f));
      while (!finished.load()) {
        grpc::ClientContext context;
        Authorize(conn, &context);
        {
          std::lock_guard<std::mutex> lock(flood_mu);
          if (finished.load()) break;
          flood_calls.push_back(&context);
        }
        auto reader = flood_stub->Generate(&context, req);
        for (v1::GenerateResponse m; reader->Read(&m);) {
        }
        reader->Finish();
        std::lock_guard<std::mutex> lock(flood_mu);
        flood_calls.erase(std::find(flood_calls.begin(), flood_calls.end(), &context));
      }
    });
  }
  if (flood_streams > 0) {  // let the flood fill the batch before the measured client starts
    for (int i = 0; i < 200; ++i) {
      grpc::ClientContext context;
      Authorize(conn, &context);
      v1::CacheStats stats;
      if (stub->GetCacheStats(&context, v1::GetCacheStatsRequest(), &stats).ok() &&
          stats.sequences_running() + stats.sequences_waiting() >= flood_streams) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  std::atomic<int32_t> max_running = 0;
  std::thread poller([&] {
    while (!finished.load()) {
      grpc::ClientContext context;
      Authorize(conn, &context);
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
      v1::CacheStats stats;
      if (stub->GetCacheStats(&context, v1::GetCacheStatsRequest(), &stats).ok()) {
        max_running = std::max(max_running.load(), stats.sequences_running());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  const bool tty = !json && isatty(STDOUT_FILENO);
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> clients;
  for (int64_t c = 0; c < std::min(concurrency, requests); ++c) {
    clients.emplace_back([&] {
      std::unique_ptr<httplib::Client> http;  // this thread's keep-alive connection
      if (!http_url.empty()) {
        http = std::make_unique<httplib::Client>(http_url);
        http->set_keep_alive(true);
        http->set_tcp_nodelay(true);  // as OpenAI clients (httpx, Node) and gRPC do
        http->set_read_timeout(3600, 0);
      }
      for (int64_t i; (i = next.fetch_add(1)) < requests;) {
        if (http) {
          RunOneHttp(*http, conn, bodies[i], results);
        } else {
          RunOne(*stub, conn, batch[i], results);
        }
        done.fetch_add(1);
      }
    });
  }
  if (tty) {
    while (done.load() < requests) {
      Progress(done.load(), requests);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    Progress(requests, requests);
    std::printf("\n");
  }
  for (std::thread& t : clients) t.join();
  const double wall = SecondsSince(start, Clock::now());
  {
    std::lock_guard<std::mutex> lock(flood_mu);
    finished = true;
    for (grpc::ClientContext* c : flood_calls) c->TryCancel();
  }
  for (std::thread& t : flooders) t.join();
  poller.join();
  if (stalls != nullptr) stalls->Finish();
  if (front_load != nullptr) front_load->Finish();

  std::sort(results.ttft.begin(), results.ttft.end());
  std::sort(results.itl.begin(), results.itl.end());
  std::sort(results.e2e.begin(), results.e2e.end());
  int64_t failed = 0;
  std::vector<std::string> error_parts;
  nlohmann::ordered_json errors = nlohmann::ordered_json::object();
  for (const auto& [code, n] : results.errors) {
    failed += n;
    error_parts.push_back(absl::StrCat(code, " ", n));
    errors[code] = n;
  }
  const double tok_s = wall > 0 ? results.completion_tokens / wall : 0;
  const double req_s = wall > 0 ? results.ok / wall : 0;
  auto ms = [](const std::vector<double>& v, double p) { return 1000 * Percentile(v, p); };
  if (json) {
    auto percentiles = [&](const std::vector<double>& v) {
      return nlohmann::ordered_json{{"p50", Rounded(ms(v, 50), 3)},
                                    {"p90", Rounded(ms(v, 90), 3)},
                                    {"p99", Rounded(ms(v, 99), 3)}};
    };
    nlohmann::ordered_json out = {{"requests", requests},
                                  {"ok", results.ok},
                                  {"failed", failed},
                                  {"errors", std::move(errors)},
                                  {"concurrency", concurrency},
                                  {"prompt_tokens", results.prompt_tokens},
                                  {"completion_tokens", results.completion_tokens},
                                  {"seconds", Rounded(wall, 4)},
                                  {"output_tokens_per_second", Rounded(tok_s, 2)},
                                  {"requests_per_second", Rounded(req_s, 3)},
                                  {"ttft_ms", percentiles(results.ttft)},
                                  {"itl_ms", percentiles(results.itl)},
                                  {"e2e_ms", percentiles(results.e2e)},
                                  {"max_running", max_running.load()},
                                  {"flood_streams", flood_streams},
                                  {"api", http_url.empty() ? "grpc" : "http"}};
    if (stalls != nullptr) out.update(stalls->Json());
    if (front_load != nullptr) out.update(front_load->Json());
    PrintJsonLine(out);
  } else {
    std::printf("requests        %lld ok, %lld failed%s%s\n", static_cast<long long>(results.ok),
                static_cast<long long>(failed), failed ? ": " : "",
                absl::StrJoin(error_parts, ", ").c_str());
    std::printf(
        "throughput      %.1f output tokens/s, %.2f requests/s (%.2f s, concurrency %lld)\n", tok_s,
        req_s, wall, static_cast<long long>(concurrency));
    std::printf("tokens          %lld prompt, %lld completion\n",
                static_cast<long long>(results.prompt_tokens),
                static_cast<long long>(results.completion_tokens));
    std::printf("TTFT ms         p50 %8.2f  p90 %8.2f  p99 %8.2f\n", ms(results.ttft, 50),
                ms(results.ttft, 90), ms(results.ttft, 99));
    std::printf("ITL ms          p50 %8.2f  p90 %8.2f  p99 %8.2f\n", ms(results.itl, 50),
                ms(results.itl, 90), ms(results.itl, 99));
    std::printf("E2E ms          p50 %8.2f  p90 %8.2f  p99 %8.2f\n", ms(results.e2e, 50),
                ms(results.e2e, 90), ms(results.e2e, 99));
    std::printf("max running     %d sequences at once\n", max_running.load());
    std::printf("API             %s\n",
                http_url.empty() ? "gRPC Generate" : ("HTTP " + http_url + " (ITL per event)").c_str());
    if (flood_streams > 0) {
      std::printf("flood           %lld streams of another client meanwhile\n",
                  static_cast<long long>(flood_streams));
    }
    if (stalls != nullptr) std::fputs(stalls->Table().c_str(), stdout);
    if (front_load != nullptr) std::fputs(front_load->Table().c_str(), stdout);
  }
  return failed > 0 || (front_load != nullptr && front_load->probes_failed()) ||
                 (stalls != nullptr && !stalls->all_matched())
             ? 1
             : 0;
}

}  // namespace heavykv::cli
