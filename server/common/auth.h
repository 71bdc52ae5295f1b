// ApiKeyStore: the API keys `heavykv serve --api-key-file` accepts, and the check every
// heavykv.v1.Generation call passes before any work: metadata `authorization: Bearer KEY` with a
// listed key, else UNAUTHENTICATED ("missing or invalid API key").
//
//   ApiKeyStore keys;
//   if (absl::Status s = keys.Load("/etc/heavykv/api-keys"); !s.ok()) ...   // start-up
//   absl::Status s = keys.CheckCall(*context, "Generate");   // per call, any gRPC thread
//   keys.ReloadAndLog();                         // on SIGHUP: a bad file keeps the old keys
//
// Guarantees: keys are compared in constant time for a given key set (every listed key is
// compared, each over its whole length, whatever the presented value); no key and no presented
// value is ever logged or put into a status message. The key set is an immutable snapshot
// swapped under a mutex, so a reload never races a check.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace heavykv::server {

// The keys in `path`: one per line, surrounding whitespace trimmed; blank lines and lines starting
// with '#' are ignored. NOT_FOUND / PERMISSION_DENIED when the file cannot be read,
// INVALID_ARGUMENT when it holds no key.
absl::StatusOr<std::vector<std::string>> ReadApiKeyFile(const std::string& path);

// true when `a` equals `b`; the time taken depends only on b's length.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

class ApiKeyStore {
 public:
  // Reads `path` and remembers it for Reload(). On error the store is unchanged.
  absl::Status Load(const std::string& path);

  // Reads the remembered file again. On error the old keys stay in force and the error is
  // returned (for the caller to log).
  absl::Status Reload();

  // Reload(), logging the outcome (the count of keys, never a key): for SIGHUP.
  void ReloadAndLog();

  // OK when `authorization` is "Bearer KEY" for a listed key; UNAUTHENTICATED otherwise (also when
  // nothing was loaded).
  absl::Status Check(std::string_view authorization) const;

  // Check() on the call's `authorization` metadata. A refusal is logged with `method` and the
  // peer, never with the presented value.
  absl::Status CheckCall(const grpc::CallbackServerContext& context, std::string_view method) const;

  size_t size() const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;  // set by Load() before any call; read-only afterwards
  mutable std::mutex mu_;
  std::shared_ptr<const std::vector<std::string>> keys_;  // guarded by mu_
};

}  // namespace heavykv::server
