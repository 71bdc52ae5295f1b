#include "server/client/metrics_scrape.h"

#include <cstdlib>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "httplib.h"

namespace heavykv::cli {

absl::StatusOr<std::map<std::string, double>> ScrapeMetrics(const std::string& url) {
  constexpr std::string_view kScheme = "http://";
  const size_t slash = url.find('/', kScheme.size());
  if (url.rfind(kScheme, 0) != 0 || url.size() == kScheme.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", url, "' is not a URL like http://127.0.0.1:9090/metrics"));
  }
  httplib::Client client(url.substr(0, slash));
  if (!client.is_valid()) {
    return absl::InvalidArgumentError(absl::StrCat("'", url, "' is not a valid URL"));
  }
  client.set_connection_timeout(5, 0);
  client.set_read_timeout(5, 0);
  const httplib::Result res = client.Get(slash == std::string::npos ? "/" : url.substr(slash));
  if (!res) {
    return absl::UnavailableError(
        absl::StrCat("cannot scrape ", url, ": ", httplib::to_string(res.error())));
  }
  if (res->status != 200) {
    return absl::UnavailableError(absl::StrCat("cannot scrape ", url, ": HTTP ", res->status));
  }
  std::map<std::string, double> out;
  std::istringstream in(res->body);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == std::string::npos || space == 0) continue;
    char* end = nullptr;
    const double v = std::strtod(line.c_str() + space + 1, &end);
    if (end == line.c_str() + space + 1) continue;
    out[line.substr(0, space)] = v;
  }
  return out;
}

bool MetricsIdle(const std::map<std::string, double>& metrics) {
  int present = 0;
  for (const char* name : kIdleSeries) {
    const auto it = metrics.find(name);
    if (it == metrics.end()) continue;
    ++present;
    if (it->second != 0) return false;
  }
  return present > 0;
}

}  // namespace heavykv::cli
