#include "server/client/tcp_client.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

#ifndef IP_BIND_ADDRESS_NO_PORT
#define IP_BIND_ADDRESS_NO_PORT 24  // linux/in.h, Linux 4.2
#endif

namespace heavykv::cli {

absl::StatusOr<TcpTarget> ResolveHttpUrl(const std::string& url) {
  constexpr std::string_view kScheme = "http://";
  const auto invalid = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("'", url, "' is not a URL like http://127.0.0.1:8000"));
  };
  if (url.rfind(kScheme, 0) != 0) return invalid();
  std::string authority = url.substr(kScheme.size());
  authority = authority.substr(0, authority.find('/'));
  std::string host = authority, port = "80";
  if (!authority.empty() && authority[0] == '[') {  // [v6]:port
    const size_t close = authority.find(']');
    if (close == std::string::npos) return invalid();
    host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') return invalid();
      port = authority.substr(close + 2);
    }
  } else if (const size_t colon = authority.rfind(':'); colon != std::string::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  }
  int port_number = 0;
  if (host.empty() || !absl::SimpleAtoi(port, &port_number) || port_number < 1 ||
      port_number > 65535) {
    return invalid();
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::NotFoundError(absl::StrCat("cannot resolve ", host, ": ", gai_strerror(rc)));
  }
  TcpTarget target;
  std::memcpy(&target.address, found->ai_addr, found->ai_addrlen);
  target.length = found->ai_addrlen;
  if (found->ai_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(found->ai_addr);
    target.ipv4_loopback = (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  freeaddrinfo(found);
  return target;
}

int StartConnect(const TcpTarget& target, const std::string& source) {
  const int fd = socket(target.address.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  const auto fail = [fd] {
    const int e = errno;
    close(fd);
    return -e;
  };
  const int yes = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
  if (!source.empty()) {
    sockaddr_in from{};
    from.sin_family = AF_INET;
    if (inet_pton(AF_INET, source.c_str(), &from.sin_addr) != 1) {
      close(fd);
      return -EINVAL;
    }
    setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &yes, sizeof yes);
    if (bind(fd, reinterpret_cast<const sockaddr*>(&from), sizeof from) != 0) return fail();
  }
  if (connect(fd, reinterpret_cast<const sockaddr*>(&target.address), target.length) != 0 &&
      errno != EINPROGRESS) {
    return fail();
  }
  return fd;
}

int ConnectError(int fd) {
  int error = 0;
  socklen_t len = sizeof error;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0) return errno;
  return error;
}

int64_t RaiseFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
    getrlimit(RLIMIT_NOFILE, &limit);
  }
  return limit.rlim_cur == RLIM_INFINITY ? INT64_MAX : static_cast<int64_t>(limit.rlim_cur);
}

int ResponseStatus(std::string_view head) {
  int code = 0;
  if (head.size() < 12 || head.substr(0, 7) != "HTTP/1." || head[8] != ' ' ||
      !absl::SimpleAtoi(absl::string_view(head.data() + 9, 3), &code)) {
    return 0;
  }
  return code;
}

}  // namespace heavykv::cli
