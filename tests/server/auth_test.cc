// ApiKeyStore and the key file format (server/common/auth.h): parsing, the Bearer check, reload.
#include "server/common/auth.h"

#include <gtest/gtest.h>

#include <fstream>

#include "tests/test_util.h"

namespace heavykv::server {
namespace {

TEST(ReadApiKeyFileTest, SkipsBlankAndCommentLinesAndTrims) {
  testing::TempDir dir;
  std::ofstream(dir.File("keys")) << "# keys\n\nalpha\r\n  beta \n\t# gamma\n#delta\nepsilon";
  absl::StatusOr<std::vector<std::string>> keys = ReadApiKeyFile(dir.File("keys"));
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(*keys, (std::vector<std::string>{"alpha", "beta", "epsilon"}));
}

TEST(ReadApiKeyFileTest, MissingAndEmptyFilesAreErrors) {
  testing::TempDir dir;
  EXPECT_EQ(ReadApiKeyFile(dir.File("missing")).status().code(), absl::StatusCode::kNotFound);
  std::ofstream(dir.File("empty")) << "# only comments\n\n   \n";
  const absl::Status s = ReadApiKeyFile(dir.File("empty")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("holds no key"), std::string::npos) << s;
}

TEST(ConstantTimeEqualsTest, ComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("secret", "secret"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals("secre", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secrets", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("Secret", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secret", ""));
  EXPECT_FALSE(ConstantTimeEquals(std::string("secret\0", 7), "secret"));
}

TEST(ApiKeyStoreTest, ChecksBearerKeysAndReloadKeepsOldKeysOnError) {
  testing::TempDir dir;
  const std::string path = dir.File("keys");
  ApiKeyStore store;
  EXPECT_EQ(store.Check("Bearer x").code(), absl::StatusCode::kUnauthenticated);  // nothing loaded
  std::ofstream(path) << "k1\nk2\n";
  ASSERT_TRUE(store.Load(path).ok());
  EXPECT_EQ(store.size(), 2u);
  EXPECT_TRUE(store.Check("Bearer k1").ok());
  EXPECT_TRUE(store.Check("Bearer k2").ok());
  EXPECT_TRUE(store.Check("bearer k2").ok());  // the scheme is case-insensitive (RFC 6750)
  for (const char* bad : {"", "k1", "Bearer", "Bearer ", "Bearer k", "Bearer k12", "Bearer K1",
                          "Basic k1", "Bearer  k1"}) {
    const absl::Status s = store.Check(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << bad;
    EXPECT_EQ(s.message(), "missing or invalid API key") << bad;
  }

  std::ofstream(path, std::ios::trunc) << "k3\n";
  ASSERT_TRUE(store.Reload().ok());
  EXPECT_FALSE(store.Check("Bearer k1").ok());
  EXPECT_TRUE(store.Check("Bearer k3").ok());

  std::ofstream(path, std::ios::trunc) << "\n";
  EXPECT_EQ(store.Reload().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(store.Check("Bearer k3").ok());  // the old keys stay
  EXPECT_EQ(store.size(), 1u);

  // A failed first Load leaves the store empty and unusable.
  ApiKeyStore other;
  EXPECT_FALSE(other.Load(dir.File("missing")).ok());
  EXPECT_EQ(other.size(), 0u);
  EXPECT_FALSE(other.Check("Bearer k3").ok());
}

}  // namespace
}  // namespace heavykv::server
