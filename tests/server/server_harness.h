// The harness of the end-to-end tests: `heavykv serve` as a child process on loopback ports
// (ServerProcess), real gRPC stubs, a raw HTTP GET, and small readers of the CLI's JSON and of
// the Prometheus text format. Header-only: each e2e test file includes it.
#pragma once
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "heavykv/v1/generation.grpc.pb.h"
#include "tests/test_util.h"

namespace heavykv::e2e {

using namespace std::chrono_literals;
using grpc::health::v1::HealthCheckResponse;

inline std::string Bin() { return HEAVYKV_BINARY; }
using testing::ReadFile;
using testing::RunCapture;


// The minimal JSON reading these tests need: `"key":[ints]` and `"key":"string"` (the escapes
// the commands' compact JSON has: nlohmann-json's, \u00XX for control characters only).
inline std::vector<int32_t> JsonInts(const std::string& json, const std::string& key) {
  std::vector<int32_t> v;
  const size_t at = json.find("\"" + key + "\":[");
  if (at == std::string::npos) return v;
  std::stringstream ss(json.substr(at + key.size() + 4));
  for (int32_t x; ss >> x;) {
    v.push_back(x);
    if (ss.peek() != ',') break;
    ss.get();
  }
  return v;
}

inline std::string JsonString(const std::string& json, const std::string& key) {
  std::string out;
  size_t i = json.find("\"" + key + "\":\"");
  if (i == std::string::npos) return out;
  for (i += key.size() + 4; i < json.size() && json[i] != '"'; ++i) {
    if (json[i] != '\\') {
      out += json[i];
      continue;
    }
    switch (const char e = json[++i]) {
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'u':  // \u00XX: only control characters are escaped
        out += static_cast<char>(std::stoi(json.substr(i + 1, 4), nullptr, 16));
        i += 4;
        break;
      default:
        out += e;
    }
  }
  return out;
}

// A socket connected to 127.0.0.1:port whose reads and writes give up after `timeout`; -1 when
// the connection fails.
inline int ConnectLoopback(int port, std::chrono::milliseconds timeout = 5s) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends `request` (raw bytes) to 127.0.0.1:port and returns all the server answers until it closes
// the connection, or what came within `timeout`.
inline std::string HttpExchange(int port, const std::string& request,
                                std::chrono::milliseconds timeout = 10s) {
  const int fd = ConnectLoopback(port, timeout);
  std::string response;
  if (fd < 0) return response;
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) == ssize_t(request.size())) {
    char buf[4096];
    for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) response.append(buf, size_t(n));
  }
  close(fd);
  return response;
}

// GET http://127.0.0.1:port/path; the body.
inline std::string HttpGet(int port, const std::string& path) {
  const std::string response =
      HttpExchange(port, "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// Prometheus text format: "name{labels} value" -> value.
inline std::map<std::string, double> ParseMetrics(const std::string& text) {
  std::map<std::string, double> m;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == std::string::npos) continue;
    m[line.substr(0, space)] = std::strtod(line.c_str() + space + 1, nullptr);
  }
  return m;
}

// The sum of every series of the metric `name` (all label sets); -1 when it has none.
inline double MetricSum(const std::map<std::string, double>& metrics, const std::string& name) {
  double sum = -1;
  for (const auto& [series, value] : metrics) {
    if (series == name || series.rfind(name + "{", 0) == 0) sum = std::max(sum, 0.0) + value;
  }
  return sum;
}

// Polls every 50 ms until `done()` or `limit` passes; whether it became true.
template <typename F>
bool WaitUntil(F done, std::chrono::milliseconds limit) {
  for (const auto until = std::chrono::steady_clock::now() + limit;;
       std::this_thread::sleep_for(50ms)) {
    if (done()) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
  }
}

// How a command ended: its exit code (with a newline) and its stdout and stderr.
struct Outcome {
  std::string code;
  std::string out;
};

// `heavykv serve --model model --threads 1` on a free gRPC port with metrics and HTTP off, then
// `flags` (the last value of a flag wins), run to its exit; a server that starts is ended by a
// 30 s timeout (the callers' cases must not start). Output goes through a file in `dir`.
inline Outcome ServeToExit(const testing::TempDir& dir, const std::string& model,
                           const std::string& flags) {
  const std::string out = dir.File("out");
  Outcome o;
  o.code = RunCapture("timeout 30 " + Bin() + " serve --model " + model +
                      " --threads 1 --listen 127.0.0.1:0 --metrics-address '' --http-address '' " +
                      flags + " > " + out + " 2>&1 < /dev/null; echo $?");
  o.out = ReadFile(out);
  return o;
}

// A field of /proc/meminfo or /proc/PID/status in bytes (its kB value x 1024); -1 when absent.
inline int64_t ProcKiBField(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string name;
    int64_t kib = 0;
    if (fields >> name >> kib && name == key + ":") return kib * 1024;
  }
  return -1;
}

// `heavykv serve` as a child process, its output in a log file, on ports it picked itself.
// stub() and the health check use `credentials` (plaintext when null) and `channel_args` (e.g.
// an SSL target name override); calls that need metadata add it to their own ClientContext.
class ServerProcess {
 public:
  explicit ServerProcess(std::vector<std::string> args,
                         std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr,
                         const grpc::ChannelArguments& channel_args = {})
      : log_(dir_.File("serve.log")) {
    args.insert(args.begin(),
                {Bin(), "serve", "--listen", "127.0.0.1:0", "--metrics-address", "127.0.0.1:0",
                 "--http-address", "127.0.0.1:0"});
    pid_ = fork();
    if (pid_ == 0) {
      std::FILE* f = std::fopen(log_.c_str(), "w");
      dup2(fileno(f), STDOUT_FILENO);
      dup2(fileno(f), STDERR_FILENO);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    const std::regex listening(
        "gRPC listening on 127\\.0\\.0\\.1:(\\d+); metrics on 127\\.0\\.0\\.1:(\\d+)");
    const std::regex http_listening("OpenAI HTTP on 127\\.0\\.0\\.1:(\\d+)");
    for (auto until = std::chrono::steady_clock::now() + 30s;
         std::chrono::steady_clock::now() < until && port_ == 0;
         std::this_thread::sleep_for(10ms)) {
      std::smatch m;
      const std::string log = ReadFile(log_);
      if (std::regex_search(log, m, listening)) {
        port_ = std::stoi(m[1]);
        metrics_port_ = std::stoi(m[2]);
        std::smatch h;
        if (std::regex_search(log, h, http_listening)) http_port_ = std::stoi(h[1]);
      }
      if (waitpid(pid_, &exit_status_, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
    }
    if (port_ == 0) return;
    if (credentials == nullptr) credentials = grpc::InsecureChannelCredentials();
    channel_ = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port_), credentials,
                                         channel_args);
    stub_ = v1::Generation::NewStub(channel_);
    health_ = grpc::health::v1::Health::NewStub(channel_);
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  bool ok() const { return port_ != 0; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int metrics_port() const { return metrics_port_; }
  int http_port() const { return http_port_; }  // the OpenAI HTTP API; 0 when off
  pid_t pid() const { return pid_; }            // -1 once it has exited (and been waited for)
  std::string log() const { return ReadFile(log_); }
  v1::Generation::Stub& stub() { return *stub_; }
  // A stub on a connection of its own (a separate client, as the server sees it): gRPC would
  // otherwise share one connection between channels to the same address.
  std::unique_ptr<v1::Generation::Stub> NewClient() const {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return v1::Generation::NewStub(grpc::CreateCustomChannel(
        address(), grpc::InsecureChannelCredentials(), args));
  }

  HealthCheckResponse::ServingStatus Health() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 2s);
    grpc::health::v1::HealthCheckRequest req;
    HealthCheckResponse resp;
    return health_->Check(&context, req, &resp).ok() ? resp.status() : HealthCheckResponse::UNKNOWN;
  }

  v1::CacheStats Stats() {
    grpc::ClientContext context;
    v1::CacheStats stats;
    EXPECT_TRUE(stub_->GetCacheStats(&context, v1::GetCacheStatsRequest(), &stats).ok());
    return stats;
  }

  // Polls until no page is used and nothing runs or waits (or 10 s pass).
  v1::CacheStats WaitIdle() {
    v1::CacheStats s;
    for (auto until = std::chrono::steady_clock::now() + 10s;
         std::chrono::steady_clock::now() < until; std::this_thread::sleep_for(5ms)) {
      s = Stats();
      if (s.pages_used() == 0 && s.sequences_running() == 0 && s.sequences_waiting() == 0) break;
    }
    return s;
  }

  std::map<std::string, double> Metrics() {
    return ParseMetrics(HttpGet(metrics_port_, "/metrics"));
  }

  // Sends `sig` and returns at once.
  void Signal(int sig) { kill(pid_, sig); }

  // Polls the log until it holds `text` `times` times or more (true), or `wait` passes (false).
  bool WaitForLog(const std::string& text, int times = 1, std::chrono::milliseconds wait = 10s) {
    for (auto until = std::chrono::steady_clock::now() + wait;
         std::chrono::steady_clock::now() < until; std::this_thread::sleep_for(10ms)) {
      const std::string log = ReadFile(log_);
      int n = 0;
      for (size_t at = log.find(text); at != std::string::npos; at = log.find(text, at + 1)) ++n;
      if (n >= times) return true;
    }
    return false;
  }

  // Sends `sig` (to the process, or with `every_thread` to each of its threads but the first:
  // a library's thread, started before main(), must not take the signal's default action);
  // the exit code, or -1 if it did not exit within `wait`.
  int SignalAndWait(int sig, std::chrono::milliseconds wait, bool every_thread = false) {
    if (every_thread) {
      for (const auto& task : std::filesystem::directory_iterator(
               "/proc/" + std::to_string(pid_) + "/task")) {
        const pid_t tid = std::stoi(task.path().filename().string());
        if (tid != pid_) syscall(SYS_tgkill, pid_, tid, sig);
      }
    } else {
      kill(pid_, sig);
    }
    for (auto until = std::chrono::steady_clock::now() + wait;
         std::chrono::steady_clock::now() < until; std::this_thread::sleep_for(10ms)) {
      if (waitpid(pid_, &exit_status_, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(exit_status_) ? WEXITSTATUS(exit_status_) : 128 + WTERMSIG(exit_status_);
      }
    }
    return -1;
  }

 private:
  testing::TempDir dir_;
  std::string log_;
  pid_t pid_ = -1;
  int exit_status_ = 0, port_ = 0, metrics_port_ = 0, http_port_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Generation::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

struct Streamed {
  grpc::Status status;
  std::vector<int32_t> ids;
  std::string text;
  int messages = 0;
  v1::GenerateResponse last;
  std::vector<float> logprobs;
  std::vector<v1::TopLogprobs> top_logprobs;
  v1::PromptLogprobs prompt_logprobs;  // with prompt_logprobs: from the message that has them
};

// Reads a Generate or Chat stream to its end.
inline Streamed ReadStream(grpc::ClientReader<v1::GenerateResponse>& reader) {
  Streamed out;
  for (v1::GenerateResponse m; reader.Read(&m); ++out.messages) {
    out.ids.insert(out.ids.end(), m.token_ids().begin(), m.token_ids().end());
    out.text += m.text();
    out.logprobs.insert(out.logprobs.end(), m.logprobs().begin(), m.logprobs().end());
    out.top_logprobs.insert(out.top_logprobs.end(), m.top_logprobs().begin(),
                            m.top_logprobs().end());
    if (m.has_prompt_logprobs()) out.prompt_logprobs = m.prompt_logprobs();
    out.last = m;
  }
  out.status = reader.Finish();
  return out;
}

inline Streamed Generate(v1::Generation::Stub& stub, const v1::GenerateRequest& req,
                  std::chrono::milliseconds timeout = 60s) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  return ReadStream(*stub.Generate(&context, req));
}

inline Streamed Chat(v1::Generation::Stub& stub, const v1::ChatRequest& req,
                     std::chrono::milliseconds timeout = 60s) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  return ReadStream(*stub.Chat(&context, req));
}

inline v1::GenerateRequest Greedy(const std::string& prompt, int32_t max_new_tokens) {
  v1::GenerateRequest req;
  req.set_prompt(prompt);
  req.set_max_new_tokens(max_new_tokens);
  req.mutable_sampling()->set_temperature(0);
  return req;
}

// A request that runs about 2 s on the slow server unless cancelled.
inline v1::GenerateRequest Long() {
  v1::GenerateRequest req;
  req.mutable_prompt_token_ids()->add_ids(1);
  req.set_max_new_tokens(2000);
  req.set_ignore_eos(true);
  req.mutable_sampling()->set_temperature(0);
  return req;
}

// `heavykv run` on the bundled model, with --steps chosen to give `max_new` new tokens.
inline std::string RunJson(const std::string& prompt, int32_t prompt_tokens, int32_t max_new) {
  return RunCapture(Bin() + " run --model " + testing::ModelPath() + " --tokenizer " +
                    testing::TokenizerPath() + " --temperature 0 --json --steps " +
                    std::to_string(prompt_tokens + max_new - 1) + " --prompt '" + prompt + "'");
}

}  // namespace heavykv::e2e
