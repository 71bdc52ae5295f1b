#include "server/common/auth.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace heavykv::server {
namespace {

constexpr std::string_view kBearer = "Bearer ";

absl::Status Unauthenticated() { return absl::UnauthenticatedError("missing or invalid API key"); }

}  // namespace

absl::StatusOr<std::vector<std::string>> ReadApiKeyFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    const int err = errno;
    const std::string why =
        absl::StrCat("cannot read --api-key-file ", path, ": ", std::strerror(err));
    return err == EACCES ? absl::PermissionDeniedError(why) : absl::NotFoundError(why);
  }
  std::vector<std::string> keys;
  for (std::string line; std::getline(in, line);) {
    const absl::string_view key = absl::StripAsciiWhitespace(line);
    if (key.empty() || key[0] == '#') continue;
    keys.emplace_back(key);
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading --api-key-file ", path));
  if (keys.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--api-key-file ", path, " holds no key (one per line; blank and # lines are ignored)"));
  }
  return keys;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Walks all of b whatever a holds, so the time tells nothing about how much of a matched.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < b.size(); ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    diff |= x ^ static_cast<unsigned char>(b[i]);
  }
  // Keep the compiler from turning the loop into an early-exit comparison.
  volatile unsigned char result = diff;
  return result == 0;
}

absl::Status ApiKeyStore::Load(const std::string& path) {
  absl::StatusOr<std::vector<std::string>> keys = ReadApiKeyFile(path);
  if (!keys.ok()) return keys.status();
  std::lock_guard<std::mutex> lock(mu_);
  path_ = path;
  keys_ = std::make_shared<const std::vector<std::string>>(*std::move(keys));
  return absl::OkStatus();
}

absl::Status ApiKeyStore::Reload() {
  absl::StatusOr<std::vector<std::string>> keys = ReadApiKeyFile(path_);
  if (!keys.ok()) return keys.status();
  std::lock_guard<std::mutex> lock(mu_);
  keys_ = std::make_shared<const std::vector<std::string>>(*std::move(keys));
  return absl::OkStatus();
}

void ApiKeyStore::ReloadAndLog() {
  if (absl::Status s = Reload(); !s.ok()) {
    spdlog::error("API keys not reloaded; the {} loaded before stay in force: {}", size(),
                  std::string(s.message()));
  } else {
    spdlog::info("API keys reloaded: {} from {}", size(), path_);
  }
}

absl::Status ApiKeyStore::Check(std::string_view authorization) const {
  std::shared_ptr<const std::vector<std::string>> keys;
  {
    std::lock_guard<std::mutex> lock(mu_);
    keys = keys_;
  }
  // RFC 6750: the scheme is case-insensitive; the key is not.
  if (keys == nullptr ||
      !absl::StartsWithIgnoreCase(absl::string_view(authorization.data(), authorization.size()),
                                  absl::string_view(kBearer.data(), kBearer.size()))) {
    return Unauthenticated();
  }
  const std::string_view presented = authorization.substr(kBearer.size());
  bool match = false;
  for (const std::string& key : *keys) match |= ConstantTimeEquals(presented, key);
  return match ? absl::OkStatus() : Unauthenticated();
}

absl::Status ApiKeyStore::CheckCall(const grpc::CallbackServerContext& context,
                                    std::string_view method) const {
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find("authorization");
  const std::string_view authorization =
      it == metadata.end() ? std::string_view()
                           : std::string_view(it->second.data(), it->second.size());
  absl::Status s = Check(authorization);
  if (!s.ok()) {
    // The method and peer only: the presented value may be a real key sent to the wrong server.
    spdlog::warn("refused {} from {}: {} API key", method, context.peer(),
                 it == metadata.end() ? "no" : "invalid");
  }
  return s;
}

size_t ApiKeyStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return keys_ == nullptr ? 0 : keys_->size();
}

}  // namespace heavykv::server
