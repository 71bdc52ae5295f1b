// Plain TCP client sockets for the load test of the HTTP front (http_flood.h, http_probe.h):
// the address of an http:// URL, non-blocking connects from a chosen source address (so that one
// process can stand for many clients of a loopback server), and the file limit thousands of
// sockets need.
//
//   absl::StatusOr<TcpTarget> target = ResolveHttpUrl("http://127.0.0.1:8000");
//   const int fd = StartConnect(*target, "127.0.0.2");  // then wait for EPOLLOUT, ConnectError()
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace heavykv::cli {

// Where an http:// URL's requests go.
struct TcpTarget {
  sockaddr_storage address{};
  socklen_t length = 0;
  bool ipv4_loopback = false;  // in 127.0.0.0/8: any 127.x.y.z may be a source address
};

// The first address of the URL's host ("http://host:port[/...]", port 80 when left out).
// INVALID_ARGUMENT for another scheme or a malformed URL, NOT_FOUND when the host does not resolve.
absl::StatusOr<TcpTarget> ResolveHttpUrl(const std::string& url);

// A non-blocking socket whose connect to `target` has started (usually still in progress: wait
// until it is writable, then read ConnectError). Bound first to the IPv4 address `source` unless
// it is empty, with the port left to connect(), so each source has its own ephemeral ports.
// -errno when no connect could start.
int StartConnect(const TcpTarget& target, const std::string& source);

// The outcome of a non-blocking connect once the socket is writable: 0, or the errno.
int ConnectError(int fd);

// Raises RLIMIT_NOFILE's soft limit to its hard limit; returns the soft limit it now has.
int64_t RaiseFileLimit();

// The status code of a response that starts with "HTTP/1.x NNN"; 0 when `head` does not (yet).
int ResponseStatus(std::string_view head);

}  // namespace heavykv::cli
