#include "server/flags/address_flags.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace heavykv {
namespace {

bool IsIpv4(const std::string& host) {
  in_addr a{};
  return inet_pton(AF_INET, host.c_str(), &a) == 1;
}

bool IsIpv6(const std::string& host) {
  in6_addr a{};
  return inet_pton(AF_INET6, host.c_str(), &a) == 1;
}

// A DNS name: labels of letters, digits and '-', joined by dots, 253 bytes at most.
bool IsDnsName(absl::string_view host) {
  if (host.empty() || host.size() > 253) return false;
  size_t label = 0;
  for (size_t i = 0; i <= host.size(); ++i) {
    if (i == host.size() || host[i] == '.') {
      if (label == 0 || label > 63 || host[i - 1] == '-' || host[i - label] == '-') return false;
      label = 0;
    } else if (absl::ascii_isalnum(host[i]) || host[i] == '-') {
      ++label;
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view flag, absl::string_view value,
                                                 bool allow_names) {
  const auto invalid = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, " '", value.substr(0, 128), "': ", why,
        "; write host:port (port 0-65535, 0 = any free port), e.g. 127.0.0.1:",
        flag == "listen" ? "50051" : flag == "metrics-address" ? "9090" : "8000"));
  };
  absl::string_view host, port;
  if (!value.empty() && value[0] == '[') {
    const size_t close = value.find(']');
    if (close == absl::string_view::npos) return invalid("no ']' after the IPv6 address");
    host = value.substr(1, close - 1);
    if (close + 1 >= value.size() || value[close + 1] != ':') return invalid("no port");
    port = value.substr(close + 2);
    if (!IsIpv6(std::string(host))) return invalid("not an IPv6 address in the brackets");
  } else {
    const size_t colon = value.rfind(':');
    if (colon == absl::string_view::npos) return invalid("no port");
    host = value.substr(0, colon);
    port = value.substr(colon + 1);
    if (host.find(':') != absl::string_view::npos) {
      return invalid("an IPv6 address must be in brackets, e.g. [::1]:8000");
    }
  }
  if (host.empty()) return invalid("no host (0.0.0.0 for every interface)");
  const std::string host_text(host);
  if (!IsIpv4(host_text) && !IsIpv6(host_text) && host != "localhost" &&
      !(allow_names && IsDnsName(host))) {
    return invalid(allow_names ? "the host is not an IP address or a DNS name"
                               : "the host is not an IP address or localhost");
  }
  int number = -1;
  const bool digits = !port.empty() && port.size() <= 5 &&
                      port.find_first_not_of("0123456789") == absl::string_view::npos;
  if (port.empty()) return invalid("no port");
  if (!digits || !absl::SimpleAtoi(port, &number) || number > 65535) {
    return invalid(absl::StrCat("port ", port.substr(0, 32), " is not in 0-65535"));
  }
  return ListenAddress{host_text, number};
}

std::string BindFailureReason(const ListenAddress& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(address.port);
  if (const int rc = getaddrinfo(address.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return gai_strerror(rc);
  }
  std::string reason;
  for (addrinfo* a = found; a != nullptr && reason.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // as the servers bind
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0) reason = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(found);
  return reason;
}

}  // namespace heavykv
