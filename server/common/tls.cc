#include "server/common/tls.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace heavykv::server {
namespace {

enum class Pem { kCertificate, kPrivateKey };

// The contents of `path`, which must hold a PEM block of the given kind.
absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path, Pem kind) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--", flag, ": cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string pem = ss.str();
  const bool ok = kind == Pem::kCertificate ? absl::StrContains(pem, "-----BEGIN CERTIFICATE-----")
                                            : absl::StrContains(pem, "PRIVATE KEY-----");
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", path, " is not a PEM ",
                     kind == Pem::kCertificate ? "certificate (-----BEGIN CERTIFICATE-----)"
                                               : "private key (-----BEGIN ... PRIVATE KEY-----)"));
  }
  return pem;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const ServerTls& tls) {
  if (!tls.enabled()) {
    if (tls.mutual()) {
      return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
    }
    return grpc::InsecureServerCredentials();
  }
  if (tls.cert.empty() || tls.key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together: give both or neither");
  }
  absl::StatusOr<std::string> cert = ReadPem("tls-cert", tls.cert, Pem::kCertificate);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem("tls-key", tls.key, Pem::kPrivateKey);
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (tls.mutual()) {
    absl::StatusOr<std::string> ca = ReadPem("tls-client-ca", tls.client_ca, Pem::kCertificate);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  options.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
  return grpc::SslServerCredentials(options);
}

std::string DescribeTls(const ServerTls& tls) {
  if (!tls.enabled()) return "TLS off (plaintext)";
  return tls.mutual() ? "mutual TLS on (client certificates required)" : "TLS on";
}

void AddClientTlsFlags(cli::FlagSet& flags, ClientTls* tls) {
  flags.String("tls-ca", &tls->ca, "PEM CA that signed the server's certificate; set = use TLS");
  flags.String("tls-cert", &tls->cert, "PEM client certificate for mutual TLS (with --tls-key)");
  flags.String("tls-key", &tls->key, "PEM private key of --tls-cert");
  flags.String("tls-server-name", &tls->server_name,
               "name to verify in the server's certificate (default: the --server host)");
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> ClientChannel(const std::string& address,
                                                             const ClientTls& tls,
                                                             bool own_connection,
                                                             int window_bytes) {
  grpc::ChannelArguments args;
  if (own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (window_bytes > 0) {
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, window_bytes);
  }
  if (tls.ca.empty()) {
    if (!tls.cert.empty() || !tls.key.empty() || !tls.server_name.empty()) {
      return absl::InvalidArgumentError(
          "--tls-cert, --tls-key and --tls-server-name need --tls-ca (the CA to verify the "
          "server with)");
    }
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }
  if (tls.cert.empty() != tls.key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together: give both or neither");
  }
  grpc::SslCredentialsOptions options;
  absl::StatusOr<std::string> ca = ReadPem("tls-ca", tls.ca, Pem::kCertificate);
  if (!ca.ok()) return ca.status();
  options.pem_root_certs = *std::move(ca);
  if (!tls.cert.empty()) {
    absl::StatusOr<std::string> cert = ReadPem("tls-cert", tls.cert, Pem::kCertificate);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPem("tls-key", tls.key, Pem::kPrivateKey);
    if (!key.ok()) return key.status();
    options.pem_cert_chain = *std::move(cert);
    options.pem_private_key = *std::move(key);
  }
  if (!tls.server_name.empty()) args.SetSslTargetNameOverride(tls.server_name);
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(options), args);
}

}  // namespace heavykv::server
