#include "server/http/cors.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "server/http/http_status.h"

namespace heavykv::server {
namespace {

constexpr char kDefaultAllowHeaders[] = "Authorization, Content-Type";
constexpr char kMaxAge[] = "600";  // seconds a browser may cache a preflight (Starlette's)

// "scheme://host[:port]" (http or https, a host of letters, digits, '.', '-', or an IPv6 literal
// in brackets, a port 1-65535), as a browser sends it in Origin.
bool ValidOrigin(absl::string_view origin) {
  absl::string_view rest = origin;
  if (!absl::ConsumePrefix(&rest, "http://") && !absl::ConsumePrefix(&rest, "https://")) {
    return false;
  }
  absl::string_view host = rest, port;
  if (!rest.empty() && rest[0] == '[') {
    const size_t close = rest.find(']');
    if (close == absl::string_view::npos) return false;
    host = rest.substr(0, close + 1);
    rest.remove_prefix(close + 1);
    if (!rest.empty() && !absl::ConsumePrefix(&rest, ":")) return false;
    port = rest;
    if (!rest.empty() && port.empty()) return false;
  } else if (const size_t colon = rest.find(':'); colon != absl::string_view::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
    if (port.empty()) return false;
  }
  if (host.empty()) return false;
  if (host[0] != '[') {
    for (char c : host) {
      if (!(absl::ascii_isalnum(c) || c == '.' || c == '-')) return false;
    }
  }
  int number = 0;
  return port.empty() ||
         (port.find_first_not_of("0123456789") == absl::string_view::npos && port.size() <= 5 &&
          absl::SimpleAtoi(port, &number) && number >= 1 && number <= 65535);
}

// A list of header names as a browser sends it in Access-Control-Request-Headers.
bool HeaderList(absl::string_view value) {
  if (value.empty() || value.size() > 1024) return false;
  for (char c : value) {
    if (!(absl::ascii_isalnum(c) || c == '-' || c == '_' || c == ',' || c == ' ')) return false;
  }
  return true;
}

void AddAllowOrigin(HttpResponse& res, const std::string& allow) {
  res.headers.emplace_back("Access-Control-Allow-Origin", allow);
  if (allow != "*") res.headers.emplace_back("Vary", "Origin");
}

// Forwards everything to the route's exchange; adds the allow header to what it answers.
class CorsExchange final : public HttpExchange {
 public:
  CorsExchange(std::shared_ptr<HttpExchange> inner, std::string allow)
      : inner_(std::move(inner)), allow_(std::move(allow)) {}

  void Respond(HttpResponse response) override {
    AddAllowOrigin(response, allow_);
    inner_->Respond(std::move(response));
  }
  void StartStream(HttpResponse head) override {
    AddAllowOrigin(head, allow_);
    inner_->StartStream(std::move(head));
  }
  void Write(std::string data) override { inner_->Write(std::move(data)); }
  void End() override { inner_->End(); }
  void OnAbort(std::function<void()> on_abort) override { inner_->OnAbort(std::move(on_abort)); }
  bool aborted() const override { return inner_->aborted(); }
  void Post(std::function<void()> work) override { inner_->Post(std::move(work)); }
  size_t queued_bytes() const override { return inner_->queued_bytes(); }
  void OnWritten(std::function<void()> on_written) override {
    inner_->OnWritten(std::move(on_written));
  }

 private:
  const std::shared_ptr<HttpExchange> inner_;
  const std::string allow_;
};

}  // namespace

std::string CorsPolicy::AllowOrigin(absl::string_view origin) const {
  if (origin.empty() || !enabled()) return "";
  if (any) return "*";
  const std::string lower = absl::AsciiStrToLower(origin);
  for (const std::string& o : origins) {
    if (o == lower) return std::string(origin);
  }
  return "";
}

absl::StatusOr<CorsPolicy> ParseCorsOrigins(absl::string_view value) {
  CorsPolicy cors;
  if (absl::StripAsciiWhitespace(value) == "*") {
    cors.any = true;
    return cors;
  }
  for (absl::string_view item : absl::StrSplit(value, ',', absl::SkipWhitespace())) {
    const std::string origin = absl::AsciiStrToLower(absl::StripAsciiWhitespace(item));
    if (origin == "*") {
      return absl::InvalidArgumentError("--http-cors-origins: '*' stands alone, not in a list");
    }
    if (!ValidOrigin(origin)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--http-cors-origins: '", origin.substr(0, 128),
          "' is not an origin: write scheme://host[:port] (http or https, no path, no trailing "
          "slash), e.g. https://app.example.com, or '*' for every origin"));
    }
    cors.origins.push_back(origin);
  }
  return cors;
}

HttpResponse CorsPreflight(const CorsPolicy& cors, const HttpRequest& req,
                           absl::string_view methods) {
  HttpResponse res;
  res.status = 204;
  res.content_type.clear();
  const std::string origin = req.Header("Origin");
  if (origin.empty() || req.Header("Access-Control-Request-Method").empty()) {
    res.headers.emplace_back("Allow", absl::StrCat(methods, ", OPTIONS"));
    return res;
  }
  const std::string allow = cors.AllowOrigin(origin);
  if (allow.empty()) {
    const absl::Status refused = absl::PermissionDeniedError(
        "this origin may not call the API from a browser (see --http-cors-origins)");
    res.status = ToHttpError(refused.code()).status;
    res.content_type = "application/json";
    res.body = ErrorBody(refused);
    return res;
  }
  AddAllowOrigin(res, allow);
  res.headers.emplace_back("Access-Control-Allow-Methods", absl::StrCat(methods, ", OPTIONS"));
  const std::string asked = req.Header("Access-Control-Request-Headers");
  res.headers.emplace_back("Access-Control-Allow-Headers",
                           HeaderList(asked) ? asked : std::string(kDefaultAllowHeaders));
  res.headers.emplace_back("Access-Control-Max-Age", kMaxAge);
  return res;
}

std::shared_ptr<HttpExchange> WithCors(const CorsPolicy& cors, const HttpRequest& req,
                                       std::shared_ptr<HttpExchange> exchange) {
  std::string allow = cors.AllowOrigin(req.Header("Origin"));
  if (allow.empty()) return exchange;
  return std::make_shared<CorsExchange>(std::move(exchange), std::move(allow));
}

}  // namespace heavykv::server
