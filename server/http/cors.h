// CORS for the OpenAI HTTP port (`serve --http-cors-origins`; docs/ARCHITECTURE.md, "CORS"):
// which browser origins may call the API, the answer to their preflights, and the header on every
// response they get.
//
//   absl::StatusOr<CorsPolicy> cors = ParseCorsOrigins("https://app.example.com");  // or "*", ""
//   routes.Add(path, "OPTIONS", [cors](const HttpRequest& req, auto ex) {
//     ex->Respond(CorsPreflight(*cors, req, "GET, POST"));
//   });
//   handler(req, WithCors(*cors, req, std::move(ex)));  // responses carry the allow header
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/http/http_server.h"

namespace heavykv::server {

struct CorsPolicy {
  bool any = false;                  // "*": every origin
  std::vector<std::string> origins;  // exact origins, lower case: "https://app.example.com:8443"

  bool enabled() const { return any || !origins.empty(); }
  // The Access-Control-Allow-Origin value for a request's `Origin` header: "*", the origin
  // itself, or "" when CORS is off, the header is absent or the origin is not allowed.
  std::string AllowOrigin(absl::string_view origin) const;
};

// The flag's value: "" (off), "*", or a comma list of origins, each scheme://host[:port] with
// scheme http or https and no path. INVALID_ARGUMENT naming --http-cors-origins otherwise.
absl::StatusOr<CorsPolicy> ParseCorsOrigins(absl::string_view value);

// The answer to OPTIONS on a route whose methods are `methods` ("GET" or "POST"): 204 with the
// Access-Control-Allow-* headers for an allowed Origin; 403 (an OpenAI error object) for another
// origin; 204 with `Allow` for an OPTIONS that is not a CORS preflight.
HttpResponse CorsPreflight(const CorsPolicy& cors, const HttpRequest& req,
                           absl::string_view methods);

// `exchange`, or, when `req` comes from an allowed origin, an exchange that adds
// Access-Control-Allow-Origin (and Vary: Origin) to its response or stream head.
std::shared_ptr<HttpExchange> WithCors(const CorsPolicy& cors, const HttpRequest& req,
                                       std::shared_ptr<HttpExchange> exchange);

}  // namespace heavykv::server
