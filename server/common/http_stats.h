// What an HTTP server has done so far (server/http/http_server.h HttpServer::Stats()), in
// server/common so that Metrics can export it without depending on server/http.
#pragma once

#include <cstdint>

namespace heavykv::server {

struct HttpServerStats {
  int64_t open_connections = 0;
  int64_t open_clients = 0;  // client addresses with an open connection (the per-client caps' keys)
  int64_t refusing = 0;      // over-cap connections being answered 503/429
  // Counters (only grow).
  int64_t accepted = 0;
  int64_t refused_max_connections = 0;  // 503: over max_connections
  int64_t refused_per_client = 0;       // 429: over max_connections_per_client
  int64_t timeouts_header = 0, timeouts_body = 0, timeouts_idle = 0, timeouts_write = 0;
  int64_t overflows = 0;  // connections that pipelined past the read buffer (413 and close)
};

}  // namespace heavykv::server
