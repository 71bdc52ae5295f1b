// The listening addresses of `heavykv serve` (--listen, --http-address, --metrics-address), all
// checked the same way before anything loads (docs/ARCHITECTURE.md, "The addresses of serve"):
//
//   absl::StatusOr<ListenAddress> a = ParseListenAddress("listen", "127.0.0.1:50051",
//                                                        /*allow_names=*/true);
//   // a->host "127.0.0.1", a->port 50051; errors name the flag: "--listen 'localhost': ..."
//
// and, once a bind has failed, why (BindFailureReason: "Address already in use").
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace heavykv {

struct ListenAddress {
  std::string host;  // without brackets: "127.0.0.1", "::1", "localhost", "node-1.example"
  int port = 0;      // 0: any free port
};

// `value` as "host:port" or "[v6]:port": the port written out in decimal, 0-65535; the host an
// IPv4 or IPv6 literal (IPv6 in brackets), "localhost", or, when `allow_names`, a DNS name.
// INVALID_ARGUMENT naming `--flag` and saying what is wrong otherwise.
absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view flag, absl::string_view value,
                                                 bool allow_names);

// Why a TCP listening socket on `address` cannot be bound now (strerror of a probe bind, e.g.
// "Address already in use"), or "" when the probe binds (the failure was something else).
std::string BindFailureReason(const ListenAddress& address);

}  // namespace heavykv
