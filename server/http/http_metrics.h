// The Prometheus endpoint: GET (and HEAD) /metrics on an HttpServer, answering the text exposition
// format (version 0.0.4) of every series in Metrics, read at the moment of the scrape.
//
//   absl::StatusOr<std::unique_ptr<HttpServer>> http = StartMetricsHttp("0.0.0.0:9090", metrics);
//   ... (*http)->port() ...
//
// Any other path is 404, any other method on /metrics 405; the connection limits are
// HttpServer's, sized so that a few stuck or hostile clients never delay a scrape.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/common/metrics.h"
#include "server/http/http_server.h"

namespace heavykv::server {

inline constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// The scrape: every series of `metrics` in the text format (also GET /metrics on the OpenAI port).
HttpResponse MetricsResponse(const Metrics& metrics);

// Serves `metrics` at http://ADDRESS/metrics ("host:port"; port 0 picks a free one, see port()).
// UNAVAILABLE when the address cannot be bound, INVALID_ARGUMENT when it is not host:port.
absl::StatusOr<std::unique_ptr<HttpServer>> StartMetricsHttp(
    const std::string& address, std::shared_ptr<const Metrics> metrics);

}  // namespace heavykv::server
