// StallStreams: `heavykv bench --stall-streams N --stall-seconds S` (issue 41). N streamed
// greedy requests whose clients read their first few events, then stop reading for S seconds
// (gRPC: no Read() on the stream; HTTP: no recv() on the socket), then read to the end. A server
// without backpressure buffers what they do not read; one with it holds their sequences out of
// decoding until they read again. Each stream's text is compared with a reference: the same
// request read without a pause, alone, before the stalls start.
//
//   absl::StatusOr<std::unique_ptr<StallStreams>> s = StallStreams::Reference(options);
//   ... sample the server ("before") ...
//   (*s)->Open();    // returns once every stream has read its first events and stopped
//   ... the measured load ...
//   (*s)->Finish();  // waits for every stream to resume and end
//   PrintJsonLine((*s)->Json()) or std::fputs((*s)->Table().c_str(), stdout);
//
// Thread-safety: the methods are called from one thread; the streams run on their own.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "heavykv/v1/generation.pb.h"
#include "nlohmann/json.hpp"
#include "server/client/client_request.h"

namespace heavykv::cli {

struct StallOptions {
  int streams = 0;
  std::chrono::milliseconds stall{0};
  int read_first = 2;  // events with tokens each stream reads before it stops
  // What every stream (and the reference) asks: bench makes it greedy, with logprobs and 20 top
  // logprobs so that each token is bulky.
  v1::GenerateRequest request;
  // gRPC: the server, TLS and key; each stream has a connection of its own (N clients).
  ConnectionFlags conn;
  // gRPC: each stalled call's HTTP/2 window (server::ClientChannel's window_bytes; 0: gRPC's
  // own, which grows to megabytes, so a short stream is all buffered by the client library and
  // the server never sees it stop).
  int window_bytes = 0;
  std::string http_url;  // not empty: the streams go to this OpenAI HTTP API instead
};

// One stream's end.
struct StallOutcome {
  std::string text;
  std::string error;       // empty: the stream ended well; else the gRPC code or HTTP error
  std::string message;     // gRPC: the status message of an error
  bool cancelled = false;  // the server ended it as cancelled (finish reason, or CANCELLED)
  bool stalled = false;    // it read its first events and paused (else it ended before)
  int64_t tokens = 0;
  double resume_seconds = 0;  // from the end of the pause to the end of the stream
};

class StallStreams {
 public:
  // Runs the reference request to its end. FAILED_PRECONDITION (with the server's error) when it
  // fails: the streams would have nothing to be compared with.
  static absl::StatusOr<std::unique_ptr<StallStreams>> Reference(const StallOptions& options);
  ~StallStreams() { Finish(); }
  StallStreams(const StallStreams&) = delete;
  StallStreams& operator=(const StallStreams&) = delete;

  // Starts the streams and waits (up to 60 s) until each has stopped reading or ended.
  void Open();
  // Waits for every stream to end. Idempotent.
  void Finish();

  // {"stall": {streams, api, stall_seconds, reference_tokens, stalled, matched, differed,
  // cancelled, failed, errors, resume_ms}}
  nlohmann::ordered_json Json() const;
  std::string Table() const;  // lines of bench's table
  // Whether every stream ended well with the reference's text.
  bool all_matched() const;
  // all_matched, Json and Table: after Finish.

 private:
  explicit StallStreams(const StallOptions& options) : options_(options) {}
  // One stream: its own connection, `pause` after read_first events (0: none).
  StallOutcome RunOne(std::chrono::milliseconds pause);

  StallOptions options_;
  StallOutcome reference_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable paused_cv_;
  int paused_ = 0;                      // guarded by mu_: streams that paused or ended
  std::vector<StallOutcome> outcomes_;  // guarded by mu_: one per stream, once it ended
};

}  // namespace heavykv::cli
