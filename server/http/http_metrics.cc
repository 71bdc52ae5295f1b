#include "server/http/http_metrics.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"

namespace heavykv::server {

absl::StatusOr<std::unique_ptr<HttpServer>> StartMetricsHttp(
    const std::string& address, std::shared_ptr<const Metrics> metrics) {
  HttpServerOptions options;
  // A scrape needs one worker; 16 let 15 clients that connect and stall (each held for at most
  // keep_alive_timeout + read_timeout) leave it one. One request per connection: Prometheus
  // scrapes every few seconds, so keep-alive would only let idle connections hold workers.
  options.threads = 16;
  options.keep_alive_max_requests = 1;
  options.keep_alive_timeout = absl::Seconds(2);
  options.read_timeout = absl::Seconds(5);
  options.write_timeout = absl::Seconds(5);
  options.max_head_bytes = 16 << 10;
  options.max_body_bytes = 4 << 10;  // a GET carries none; anything larger is refused (413)
  HttpServer::Routes routes;
  routes.Add("/metrics", "GET",
             [metrics = std::move(metrics)](const httplib::Request&, httplib::Response& res) {
               res.set_content(prometheus::TextSerializer().Serialize(metrics->Collect()),
                               kMetricsContentType);
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
