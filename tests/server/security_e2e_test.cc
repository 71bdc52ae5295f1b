// End-to-end tests of `heavykv serve`'s security flags against the real binary on loopback:
// TLS and mutual TLS (certificates made at test time with the openssl command line), API keys on
// every heavykv.v1.Generation method (and not on health), SIGHUP key reload, reflection behind
// --reflection, the start-up errors, and the `generate` / `bench` clients' TLS and key flags.
#include <grpcpp/generic/generic_stub.h>

#include <cstdlib>
#include <future>

#include "tests/server/server_harness.h"

namespace heavykv::e2e {
namespace {

const std::string kKeyOne = "hk-test-7f3a9c1e5b2d4a60";
const std::string kKeyTwo = "hk-test-0c9e8d7b6a5f4e31";
const std::string kWrongKey = "hk-test-ffffffffffffffff";

// A CA, a server certificate for localhost / 127.0.0.1 and a client certificate, as PEM files.
class Pki {
 public:
  Pki() {
    std::ofstream(dir_.File("ext.cnf")) << "[ca]\n"
                                           "basicConstraints = critical, CA:TRUE\n"
                                           "keyUsage = critical, keyCertSign, cRLSign\n"
                                           "[server]\n"
                                           "basicConstraints = CA:FALSE\n"
                                           "extendedKeyUsage = serverAuth\n"
                                           "subjectAltName = DNS:localhost, IP:127.0.0.1\n"
                                           "[client]\n"
                                           "basicConstraints = CA:FALSE\n"
                                           "extendedKeyUsage = clientAuth\n";
    const std::string d = dir_.File("");
    const std::string key = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const std::string cnf = " -config " + d + "ext.cnf";
    std::string script = "set -e; cd " + d + "; openssl req -x509" + key +
                         " -keyout ca.key -out ca.pem -days 2 -subj '/CN=heavykv test CA'" + cnf +
                         " -extensions ca";
    for (const char* who : {"server", "client"}) {
      const std::string w = who;
      script += "; openssl req" + key + " -keyout " + w + ".key -out " + w +
                ".csr -subj '/CN=" + (w == "server" ? "localhost" : "heavykv-test-client") + "'" +
                cnf + "; openssl x509 -req -in " + w +
                ".csr -CA ca.pem -CAkey ca.key -CAcreateserial" + " -out " + w +
                ".pem -days 2 -extfile ext.cnf -extensions " + w;
    }
    script += "; echo PKI-OK";
    log_ = RunCapture("bash -c \"" + script + "\" 2>&1");
  }

  bool ok() const { return log_.find("PKI-OK") != std::string::npos; }
  const std::string& log() const { return log_; }
  std::string File(const std::string& name) const { return dir_.File(name); }
  std::string Pem(const std::string& name) const { return ReadFile(File(name)); }

  // Verifies the server against the CA; presents the client certificate when
  // `with_client_cert`.
  std::shared_ptr<grpc::ChannelCredentials> Client(bool with_client_cert = false) const {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = Pem("ca.pem");
    if (with_client_cert) {
      o.pem_cert_chain = Pem("client.pem");
      o.pem_private_key = Pem("client.key");
    }
    return grpc::SslCredentials(o);
  }

 private:
  testing::TempDir dir_;
  std::string log_;
};

std::vector<std::string> ModelArgs(std::vector<std::string> more = {}) {
  std::vector<std::string> args = {
      "--model", testing::ModelPath(), "--tokenizer", testing::TokenizerPath(), "--threads", "1"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// `heavykv serve ARGS` expected to refuse to start: its exit code and output.
std::pair<int, std::string> ServeFails(const std::string& args) {
  const std::string out = RunCapture(Bin() + " serve --listen 127.0.0.1:0 --metrics-address '' --http-address '' " +
                                     args + " 2>&1; echo \"exit=$?\"");
  const size_t at = out.rfind("exit=");
  return {at == std::string::npos ? -1 : std::atoi(out.c_str() + at + 5), out};
}

// The status of each heavykv.v1.Generation method called with `authorization` (none if empty).
std::map<std::string, grpc::StatusCode> CallEveryMethod(v1::Generation::Stub& stub,
                                                        const std::string& authorization) {
  auto context = [&](grpc::ClientContext& c) {
    c.set_deadline(std::chrono::system_clock::now() + 30s);
    if (!authorization.empty()) c.AddMetadata("authorization", authorization);
  };
  std::map<std::string, grpc::StatusCode> out;
  {
    grpc::ClientContext c;
    context(c);
    auto reader = stub.Generate(&c, Greedy("Once upon a time", 4));
    for (v1::GenerateResponse m; reader->Read(&m);) {
    }
    const grpc::Status s = reader->Finish();
    if (!s.ok()) {
      EXPECT_EQ(s.error_message(), "missing or invalid API key");
    }
    out["Generate"] = s.error_code();
  }
  {
    grpc::ClientContext c;
    context(c);
    v1::TokenizeRequest req;
    req.set_text("Once upon a time");
    v1::TokenizeResponse resp;
    const grpc::Status s = stub.Tokenize(&c, req, &resp);
    if (!s.ok()) {
      EXPECT_EQ(s.error_message(), "missing or invalid API key");
    } else {
      EXPECT_GT(resp.token_ids_size(), 0);
    }
    out["Tokenize"] = s.error_code();
  }
  {
    grpc::ClientContext c;
    context(c);
    v1::ModelInfo info;
    const grpc::Status s = stub.GetModelInfo(&c, v1::GetModelInfoRequest(), &info);
    if (s.ok()) {
      EXPECT_EQ(info.vocab_size(), 512);
    }
    out["GetModelInfo"] = s.error_code();
  }
  {
    grpc::ClientContext c;
    context(c);
    v1::CacheStats stats;
    const grpc::Status s = stub.GetCacheStats(&c, v1::GetCacheStatsRequest(), &stats);
    if (s.ok()) {
      EXPECT_GT(stats.pages_total(), 0);
    }
    out["GetCacheStats"] = s.error_code();
  }
  return out;
}

std::map<std::string, grpc::StatusCode> AllAre(grpc::StatusCode code) {
  return {{"Generate", code}, {"Tokenize", code}, {"GetModelInfo", code}, {"GetCacheStats", code}};
}

// Server reflection's ServerReflectionInfo with one list_services request (field 7, "").
grpc::Status ListServices(const std::shared_ptr<grpc::Channel>& channel, std::string* reply) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 10s);
  const std::string list_services = std::string("\x3a\x00", 2);
  grpc::Slice slice(list_services);
  grpc::ByteBuffer request(&slice, 1), response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                 grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  const grpc::Status s = done.get_future().get();
  std::vector<grpc::Slice> slices;
  if (s.ok() && response.Dump(&slices).ok()) {
    for (const grpc::Slice& x : slices)
      reply->append(reinterpret_cast<const char*>(x.begin()), x.size());
  }
  return s;
}

class SecurityE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { pki_ = new Pki(); }
  static void TearDownTestSuite() {
    delete pki_;
    pki_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(pki_->ok()) << "openssl failed:\n" << pki_->log(); }

  std::vector<std::string> TlsArgs(bool mutual = false) const {
    std::vector<std::string> a = {"--tls-cert", pki_->File("server.pem"), "--tls-key",
                                  pki_->File("server.key")};
    if (mutual) a.insert(a.end(), {"--tls-client-ca", pki_->File("ca.pem")});
    return a;
  }

  static Pki* pki_;
  testing::TempDir dir_;
};

Pki* SecurityE2eTest::pki_ = nullptr;

TEST_F(SecurityE2eTest, TlsGenerateEqualsPlaintextAndPlaintextClientsFail) {
  ServerProcess plain(ModelArgs());
  ServerProcess tls(ModelArgs(TlsArgs()), pki_->Client());
  ASSERT_TRUE(plain.ok()) << plain.log();
  ASSERT_TRUE(tls.ok()) << tls.log();
  EXPECT_NE(tls.log().find("gRPC security: TLS on;"), std::string::npos) << tls.log();
  EXPECT_NE(plain.log().find("gRPC security: TLS off (plaintext);"), std::string::npos);

  const Streamed want = Generate(plain.stub(), Greedy("Once upon a time", 32));
  const Streamed got = Generate(tls.stub(), Greedy("Once upon a time", 32));
  ASSERT_TRUE(want.status.ok()) << want.status.error_message();
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.ids.size(), 32u);
  EXPECT_EQ(got.text, want.text);
  EXPECT_EQ(got.ids, want.ids);
  EXPECT_EQ(tls.Health(), HealthCheckResponse::SERVING);

  // A plaintext client gets no answer from the TLS port.
  auto insecure = v1::Generation::NewStub(
      grpc::CreateChannel(tls.address(), grpc::InsecureChannelCredentials()));
  const Streamed refused = Generate(*insecure, Greedy("Once upon a time", 4), 5s);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(refused.ids.empty());

  // A TLS client that does not trust the server's CA fails too (its own roots lack the test CA).
  grpc::SslCredentialsOptions other;
  other.pem_root_certs = pki_->Pem("client.pem");  // not a CA: verifies nothing
  auto untrusting =
      v1::Generation::NewStub(grpc::CreateChannel(tls.address(), grpc::SslCredentials(other)));
  EXPECT_EQ(Generate(*untrusting, Greedy("Once", 4), 5s).status.error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(SecurityE2eTest, MutualTlsNeedsTheClientCertificate) {
  ServerProcess server(ModelArgs(TlsArgs(/*mutual=*/true)), pki_->Client(true));
  ASSERT_TRUE(server.ok()) << server.log();
  EXPECT_NE(server.log().find("gRPC security: mutual TLS on (client certificates required)"),
            std::string::npos);
  const Streamed with_cert = Generate(server.stub(), Greedy("Once upon a time", 8));
  EXPECT_TRUE(with_cert.status.ok()) << with_cert.status.error_message();
  EXPECT_EQ(with_cert.ids.size(), 8u);

  auto no_cert = v1::Generation::NewStub(grpc::CreateChannel(server.address(), pki_->Client()));
  const Streamed refused = Generate(*no_cert, Greedy("Once upon a time", 8), 5s);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(refused.ids.empty());
}

TEST_F(SecurityE2eTest, ApiKeysGuardEveryGenerationMethodButNotHealth) {
  const std::string keys = dir_.File("keys");
  std::ofstream(keys) << "# heavykv API keys\n\n"
                      << kKeyOne << "\n  " << kKeyTwo << "  \n#" << kWrongKey << "\n";
  ServerProcess server(ModelArgs({"--api-key-file", keys}));
  ASSERT_TRUE(server.ok()) << server.log();
  EXPECT_NE(server.log().find("API keys on (2 from"), std::string::npos) << server.log();
  std::map<std::string, double> m = server.Metrics();
  const std::string rejected = "heavykv_request_rejected_total{code=\"UNAUTHENTICATED\"}";
  ASSERT_TRUE(m.count(rejected)) << "exported at 0 before the first refusal";
  EXPECT_EQ(m[rejected], 0);

  EXPECT_EQ(CallEveryMethod(server.stub(), ""), AllAre(grpc::StatusCode::UNAUTHENTICATED));
  for (const std::string& bad : std::vector<std::string>{
           "Bearer " + kWrongKey, "Bearer " + kKeyOne.substr(0, kKeyOne.size() - 1),
           "Bearer " + kKeyOne + "0", "Bearer", "Bearer ", kKeyOne, "Basic " + kKeyOne,
           "Bearer  " + kKeyOne}) {
    EXPECT_EQ(CallEveryMethod(server.stub(), bad), AllAre(grpc::StatusCode::UNAUTHENTICATED))
        << bad;
  }
  EXPECT_EQ(CallEveryMethod(server.stub(), "Bearer " + kKeyOne), AllAre(grpc::StatusCode::OK));
  EXPECT_EQ(CallEveryMethod(server.stub(), "Bearer " + kKeyTwo), AllAre(grpc::StatusCode::OK));
  EXPECT_EQ(server.Health(), HealthCheckResponse::SERVING);  // no key needed

  m = server.Metrics();
  EXPECT_EQ(m[rejected], 4 * 9);  // 9 refused authorizations x 4 methods
  const std::string log = server.log();
  EXPECT_NE(log.find("refused Generate from"), std::string::npos) << log;
  for (const std::string& key :
       std::vector<std::string>{kKeyOne, kKeyTwo, kWrongKey, kKeyOne.substr(0, 12)}) {
    EXPECT_EQ(log.find(key), std::string::npos) << "the log shows " << key << ":\n" << log;
  }
}

TEST_F(SecurityE2eTest, SighupReloadsTheKeysAndABadFileKeepsThem) {
  const std::string keys = dir_.File("keys");
  std::ofstream(keys) << kKeyOne << "\n";
  ServerProcess server(ModelArgs({"--api-key-file", keys}));
  ASSERT_TRUE(server.ok()) << server.log();
  EXPECT_EQ(CallEveryMethod(server.stub(), "Bearer " + kKeyOne), AllAre(grpc::StatusCode::OK));

  std::ofstream(keys, std::ios::trunc) << kKeyTwo << "\n";
  server.Signal(SIGHUP);
  ASSERT_TRUE(server.WaitForLog("API keys reloaded: 1 from")) << server.log();
  EXPECT_EQ(CallEveryMethod(server.stub(), "Bearer " + kKeyOne),
            AllAre(grpc::StatusCode::UNAUTHENTICATED));
  EXPECT_EQ(CallEveryMethod(server.stub(), "Bearer " + kKeyTwo), AllAre(grpc::StatusCode::OK));

  // An empty file on reload: an error in the log, the keys of before stay in force.
  std::ofstream(keys, std::ios::trunc) << "# nothing\n";
  server.Signal(SIGHUP);
  ASSERT_TRUE(server.WaitForLog("API keys not reloaded; the 1 loaded before stay in force"))
      << server.log();
  EXPECT_EQ(CallEveryMethod(server.stub(), "Bearer " + kKeyTwo), AllAre(grpc::StatusCode::OK));
  std::filesystem::remove(keys);
  server.Signal(SIGHUP);
  ASSERT_TRUE(server.WaitForLog("API keys not reloaded", 2)) << server.log();
  EXPECT_EQ(CallEveryMethod(server.stub(), "Bearer " + kKeyTwo), AllAre(grpc::StatusCode::OK));

  for (const std::string& key : {kKeyOne, kKeyTwo}) {
    EXPECT_EQ(server.log().find(key), std::string::npos) << server.log();
  }
  EXPECT_EQ(server.SignalAndWait(SIGTERM, 20s), 0);  // SIGTERM still drains
}

TEST_F(SecurityE2eTest, ReflectionIsOffUnlessAskedFor) {
  ServerProcess off(ModelArgs());
  ServerProcess on(ModelArgs({"--reflection"}));
  ASSERT_TRUE(off.ok()) << off.log();
  ASSERT_TRUE(on.ok()) << on.log();
  std::string reply;
  EXPECT_EQ(
      ListServices(grpc::CreateChannel(off.address(), grpc::InsecureChannelCredentials()), &reply)
          .error_code(),
      grpc::StatusCode::UNIMPLEMENTED);
  const grpc::Status s =
      ListServices(grpc::CreateChannel(on.address(), grpc::InsecureChannelCredentials()), &reply);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_NE(reply.find("heavykv.v1.Generation"), std::string::npos) << reply;
  EXPECT_NE(on.log().find("reflection on"), std::string::npos);
}

TEST_F(SecurityE2eTest, StartUpErrors) {
  const std::string model = " --model " + testing::ModelPath();
  const std::string empty = dir_.File("empty"), not_pem = dir_.File("not.pem");
  std::ofstream(empty) << "# only a comment\n\n   \n";
  std::ofstream(not_pem) << "hello\n";
  const struct {
    std::string args, message;
  } cases[] = {
      {"--api-key-file " + dir_.File("missing"), "cannot read --api-key-file"},
      {"--api-key-file " + empty, "holds no key"},
      {"--tls-cert " + pki_->File("server.pem"), "--tls-cert and --tls-key go together"},
      {"--tls-key " + pki_->File("server.key"), "--tls-cert and --tls-key go together"},
      {"--tls-client-ca " + pki_->File("ca.pem"), "--tls-client-ca needs --tls-cert"},
      {"--tls-cert " + dir_.File("missing") + " --tls-key " + pki_->File("server.key"),
       "--tls-cert: cannot read"},
      {"--tls-cert " + pki_->File("server.key") + " --tls-key " + pki_->File("server.pem"),
       "is not a PEM certificate"},
      {"--tls-cert " + pki_->File("server.pem") + " --tls-key " + not_pem,
       "is not a PEM private key"},
      {"--tls-cert " + pki_->File("server.pem") + " --tls-key " + pki_->File("client.key"),
       "check that --tls-key is the key of --tls-cert"},
      {"--reflection --api-key-file " + empty, "the reflection service cannot check API keys"},
  };
  for (const auto& c : cases) {
    const auto [code, out] = ServeFails(c.args + model);
    EXPECT_NE(code, 0) << c.args << "\n" << out;
    EXPECT_NE(out.find(c.message), std::string::npos) << c.args << "\n" << out;
    EXPECT_EQ(out.find("gRPC listening"), std::string::npos) << out;
  }
}

TEST_F(SecurityE2eTest, GenerateAndBenchCliUseTlsAndTheKey) {
  const std::string keys = dir_.File("keys");
  std::ofstream(keys) << kKeyOne << "\n";
  std::vector<std::string> args = TlsArgs(/*mutual=*/true);
  args.insert(args.end(), {"--api-key-file", keys});
  ServerProcess server(ModelArgs(args));
  ServerProcess plain(ModelArgs());
  ASSERT_TRUE(server.ok()) << server.log();
  ASSERT_TRUE(plain.ok()) << plain.log();
  const Streamed want = Generate(plain.stub(), Greedy("Once upon a time", 16));
  ASSERT_TRUE(want.status.ok());

  // --tls-server-name: the certificate names localhost; the client dials 127.0.0.1 (which the
  // certificate also lists, so a wrong override is what fails below).
  const std::string tls = " --server " + server.address() + " --tls-ca " + pki_->File("ca.pem") +
                          " --tls-cert " + pki_->File("client.pem") + " --tls-key " +
                          pki_->File("client.key") + " --tls-server-name localhost";
  const std::string gen = Bin() + " generate" + tls + " --temperature 0 --max-tokens 16 --json";
  const std::string no_env = "env -u HEAVYKV_API_KEY ";
  const std::string ok = RunCapture(no_env + gen + " --api-key " + kKeyOne + " 'Once upon a time'");
  EXPECT_EQ(JsonString(ok, "text"), want.text) << ok;
  EXPECT_EQ(JsonInts(ok, "token_ids"), want.ids) << ok;

  const std::string from_env =
      RunCapture("HEAVYKV_API_KEY=" + kKeyOne + " " + gen + " 'Once upon a time'");
  EXPECT_EQ(JsonString(from_env, "text"), want.text) << from_env;

  const std::string no_key =
      RunCapture(no_env + gen + " 'Once upon a time' 2>&1; echo \"exit=$?\"");
  EXPECT_NE(no_key.find("error: UNAUTHENTICATED: missing or invalid API key"), std::string::npos)
      << no_key;
  EXPECT_NE(no_key.find("exit=1"), std::string::npos) << no_key;

  const std::string wrong_name =
      RunCapture(no_env + gen + " --api-key " + kKeyOne + " --tls-server-name other.example" +
                 " 'Once upon a time' 2>&1; echo \"exit=$?\"");
  EXPECT_NE(wrong_name.find("error: UNAVAILABLE"), std::string::npos) << wrong_name;

  const std::string bench =
      RunCapture(no_env + Bin() + " bench" + tls + " --api-key " + kKeyOne +
                 " --concurrency 2 --requests 4 --prompt-tokens 8 --max-tokens 4 --json 2>&1");
  EXPECT_NE(bench.find("\"ok\":4,\"failed\":0"), std::string::npos) << bench;

  EXPECT_EQ(server.log().find(kKeyOne), std::string::npos) << server.log();
}

}  // namespace
}  // namespace heavykv::e2e
