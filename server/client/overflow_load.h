// OverflowLoad: `heavykv bench --overflow-connections N` (issue 41). N client connections to an
// HTTP server, at most `concurrency` open at once, each sending one whole request followed by
// more bytes than the server's read buffer holds (200 KB of 'A': the bytes of a "next request"
// that never parses), then closing. A server that stops reading once its buffer is full never
// sees those closes: its connection slots and the generations they started leak. One thread and
// epoll drive every socket.
//
//   OverflowOptions o{.target = *ResolveHttpUrl(url), .connections = 10000,
//                     .requests = {plain_request, streamed_request}};
//   absl::StatusOr<OverflowStats> s = RunOverflow(o);  // returns once every connection is closed
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/client/tcp_client.h"

namespace heavykv::cli {

struct OverflowOptions {
  TcpTarget target;
  int connections = 0;
  int concurrency = 256;  // connections open (or connecting) at once
  // IPv4 source addresses the sockets are bound to, round-robin; empty: the kernel's choice.
  std::vector<std::string> sources;
  // Whole HTTP requests (head and body); connection i sends requests[i % size].
  std::vector<std::string> requests;
  size_t extra_bytes = 200 * 1024;  // 'A's after the request
  // Once every byte is sent, wait up to this long for the first byte of a response before
  // closing (0: close at once).
  std::chrono::milliseconds hold{0};
  // A connect that does not complete this long fails; a send that makes no progress this long (the
  // server stopped reading) is given up and the connection closed.
  std::chrono::milliseconds send_timeout{5000};
};

struct OverflowStats {
  int64_t opened = 0;            // connections that connected
  int64_t connect_failures = 0;  // refused, reset, timed out or no socket
  int64_t sent_all = 0;          // sent the request and every extra byte
  int64_t send_stalled = 0;      // closed after send_timeout with bytes still unsent
  int64_t closed_by_server = 0;  // the server ended the connection before the client did
  // What the server had answered when the connection ended, by the status of its first bytes:
  // "200", "429", ..., or "none" (nothing, or not a status line).
  std::map<std::string, int64_t> responses;
  double seconds = 0;  // the first connect to the last close
};

// Opens the connections and returns when all of them are closed. INVALID_ARGUMENT without
// requests or with a concurrency below 1, INTERNAL when epoll cannot be created.
absl::StatusOr<OverflowStats> RunOverflow(const OverflowOptions& options);

}  // namespace heavykv::cli
