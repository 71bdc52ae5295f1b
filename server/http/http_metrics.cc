#include "server/http/http_metrics.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"

namespace heavykv::server {

HttpResponse MetricsResponse(const Metrics& metrics) {
  HttpResponse res;
  res.content_type = kMetricsContentType;
  res.body = prometheus::TextSerializer().Serialize(metrics.Collect());
  return res;
}

absl::StatusOr<std::unique_ptr<HttpServer>> StartMetricsHttp(
    const std::string& address, std::shared_ptr<const Metrics> metrics) {
  HttpServerOptions options;
  // A scrape is one short request: one CPU thread serves it, and the event loop holds any number
  // of stalled clients without delaying it. One request per connection: Prometheus scrapes every
  // few seconds, so keep-alive would only keep idle connections open.
  options.cpu_threads = 1;
  options.keep_alive_max_requests = 1;
  options.header_timeout = absl::Seconds(5);
  options.body_timeout = absl::Seconds(5);
  options.write_timeout = absl::Seconds(5);
  options.max_head_bytes = 16 << 10;
  options.max_body_bytes = 4 << 10;  // a GET carries none; anything larger is refused (413)
  options.max_connections = 1024;
  options.max_connections_per_client = 256;
  HttpServer::Routes routes;
  routes.Add("/metrics", "GET",
             [metrics = std::move(metrics)](const HttpRequest&,
                                            std::shared_ptr<HttpExchange> exchange) {
               exchange->Respond(MetricsResponse(*metrics));
             });
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start(address, std::move(routes), options);
  if (!server.ok()) {
    return absl::Status(server.status().code(),
                        absl::StrCat("metrics: ", server.status().message(),
                                     "; choose another --metrics-address (empty: no metrics)"));
  }
  return server;
}

}  // namespace heavykv::server
