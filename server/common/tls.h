// TLS for the gRPC port: the server's credentials from `heavykv serve --tls-cert/--tls-key
// [--tls-client-ca]`, and the clients' (`generate`, `bench`) channel from `--tls-ca
// [--tls-cert --tls-key] [--tls-server-name]`. PEM files only.
//
//   ServerTls tls{cert_path, key_path, client_ca_path};
//   absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds = ServerCredentials(tls);
//   builder.AddListeningPort(listen, *creds, &port);
//
// Every file is read and checked to hold the PEM block it should at start-up, so a wrong path or
// a swapped cert/key is a clear INVALID_ARGUMENT / NOT_FOUND before anything listens. (Whether the
// key matches the certificate is left to gRPC, which then fails to listen.)
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/flags/cli_flags.h"

namespace heavykv::server {

struct ServerTls {
  std::string cert, key;  // both or neither; neither = plaintext
  std::string client_ca;  // set: clients must present a certificate signed by this CA (mTLS)

  bool enabled() const { return !cert.empty() || !key.empty(); }
  bool mutual() const { return !client_ca.empty(); }
};

// Insecure credentials when TLS is off; otherwise SSL credentials from the files.
// INVALID_ARGUMENT for --tls-cert without --tls-key (or the reverse), --tls-client-ca without
// both, or a file without its PEM block; NOT_FOUND for a file that cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const ServerTls& tls);

// "TLS off (plaintext)", "TLS on", "mutual TLS on (client certificates required)".
std::string DescribeTls(const ServerTls& tls);

struct ClientTls {
  std::string ca;           // set: use TLS and verify the server with this CA
  std::string cert, key;    // client certificate for mutual TLS (both or neither; needs ca)
  std::string server_name;  // the name checked in the server's certificate (default: host)
};

// Registers --tls-ca, --tls-cert, --tls-key, --tls-server-name.
void AddClientTlsFlags(cli::FlagSet& flags, ClientTls* tls);

// A channel to `address`: plaintext without --tls-ca, TLS otherwise. Errors as
// ServerCredentials. `own_connection`: never share a connection with another channel (gRPC
// shares them between channels with the same arguments), so the server sees another client.
// `window_bytes` > 0: a fixed HTTP/2 stream window of that many bytes (no BDP growth), so that a
// call that stops reading stops the server's writes after about that much, as a busy client
// would; 0: gRPC's own window, which grows to megabytes.
absl::StatusOr<std::shared_ptr<grpc::Channel>> ClientChannel(const std::string& address,
                                                             const ClientTls& tls,
                                                             bool own_connection = false,
                                                             int window_bytes = 0);

}  // namespace heavykv::server
