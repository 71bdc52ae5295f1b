// The HTTP side of `heavykv bench --http URL`: one streamed OpenAI completion (POST
// /v1/completions with stream: true and usage) of a GenerateRequest's prompt token ids and fields,
// timed as bench times a gRPC stream, so the two fronts can be compared side by side.
//
//   httplib::Client client("http://127.0.0.1:8000");   // one per client thread (keep-alive)
//   StreamTiming t = StreamCompletion(client, CompletionBody(request), api_key);
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "heavykv/v1/generation.pb.h"
#include "httplib.h"

namespace heavykv::cli {

// One stream as bench records it.
struct StreamTiming {
  std::string error;  // empty: ok; else the status ("http_429", "connection", "bad_stream")
  double ttft = -1;   // seconds to the first event with text
  // Seconds between events with text, each split evenly over the tokens it carried where known;
  // over HTTP an event is one engine delta (usually one token).
  std::vector<double> itl;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  std::string text;           // choices[0].text of every event, joined
  std::string finish_reason;  // of the last choice that had one ("length", "abort", ...)
};

// Nearest-rank percentile `p` (0-100) of sorted values; 0 for none. bench's summaries (latencies
// of streams and of the HTTP probe) all use it.
double Percentile(const std::vector<double>& sorted, double p);

// The /v1/completions body of `request` (prompt token ids, max_tokens, sampling, stop, kv, ...),
// streamed with stream_options.include_usage.
std::string CompletionBody(const v1::GenerateRequest& request);

// Sends `body` and reads the SSE stream to [DONE]; `api_key` (if any) as a Bearer token.
// `on_text`, when set, runs after each event with text, given how many there have been; no byte
// is read while it runs (bench's stalled streams sleep in it: a client that stops reading).
StreamTiming StreamCompletion(httplib::Client& client, const std::string& body,
                              const std::string& api_key,
                              const std::function<void(int64_t events)>& on_text = nullptr);

}  // namespace heavykv::cli
