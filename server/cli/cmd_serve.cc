// heavykv serve: the gRPC inference server (heavykv.v1.Generation, grpc.health.v1.Health,
// server reflection with --reflection) with Prometheus metrics over HTTP, and the OpenAI HTTP API
// (--http-address; server/http/openai_http.h) on the same engine.
//
// SIGTERM / SIGINT drain the server: health turns NOT_SERVING (HTTP /health 503), new requests
// get UNAVAILABLE (HTTP 503), running ones have --grace seconds to finish, the rest are cancelled
// (their streams end with finish_reason CANCELLED; HTTP "abort"), then the server exits 0.
// SIGHUP reloads --api-key-file.
//
// Security (server/common/tls.h, server/common/auth.h): --tls-cert/--tls-key [--tls-client-ca] put
// the gRPC port on (mutual) TLS; --api-key-file makes every heavykv.v1.Generation call, and every
// HTTP API request but /health, carry a listed key (health stays open for probes); reflection only
// with
// --reflection, never with API keys, since the reflection service cannot be made to check them.
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "engine/serving/engine.h"
#include "engine/runner/model_runner.h"
#include "engine/runner/step_runner.h"
#include "server/common/auth.h"
#include "server/flags/address_flags.h"
#include "server/flags/cli_flags.h"
#include "server/flags/dtype_flags.h"
#include "server/flags/policy_flags.h"
#include "server/cli/commands.h"
#include "server/grpc/grpc_service.h"
#include "server/cli/host_memory.h"
#include "server/cli/serve_pool.h"
#include "server/http/http_metrics.h"
#include "server/common/metrics.h"
#include "server/http/openai_http.h"
#include "server/grpc/reflection.h"
#include "server/common/tls.h"
#include "spdlog/spdlog.h"

namespace heavykv::cli {
namespace {

int drain_pipe[2] = {-1, -1};  // written by the signal handler, read by the main thread

// Until the server is up, SIGTERM/SIGINT end the process at once (a start-up that loads a model or
// fills a pool has nothing to drain); from then on they drain it.
volatile sig_atomic_t serving = 0;

extern "C" void OnDrainSignal(int sig) {
  if (!serving) _exit(128 + sig);
  const char c = static_cast<char>(sig);
  const int saved = errno;  // a handler must leave errno as it found it
  [[maybe_unused]] ssize_t n = write(drain_pipe[1], &c, 1);
  errno = saved;
}

absl::Status InstallDrainSignals() {
  if (pipe2(drain_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  struct sigaction sa = {};
  sa.sa_handler = OnDrainSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    if (sigaction(sig, &sa, nullptr) != 0) {
      return absl::InternalError(absl::StrCat("sigaction: ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

// Blocks until SIGINT, SIGTERM or SIGHUP arrives; returns its number.
int WaitForDrainSignal() {
  char c = 0;
  while (read(drain_pipe[0], &c, 1) != 1) {
    if (errno != EINTR) return SIGTERM;  // the pipe broke: treat it as a request to stop
  }
  return c;
}

absl::Status CheckRange(const char* flag, int64_t v, int64_t lo, int64_t hi) {
  if (v >= lo && v <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, " ", v, " must be in [", lo, ", ", hi, "]"));
}

// A port that cannot be bound: a run-time failure (exit 1), unlike a flag error (Fail: exit 2).
int FailToListen(const absl::Status& status) {
  Fail(status);
  return 1;
}

// "host:port" with the port that was actually bound.
std::string WithPort(const std::string& address, int port) {
  const size_t colon = address.rfind(':');
  return absl::StrCat(colon == std::string::npos ? address : address.substr(0, colon), ":", port);
}

}  // namespace

int ServeCommand(int argc, char** argv) {
  std::string model_path, tokenizer_path, chat_template_path, listen = "0.0.0.0:50051",
                                          metrics_address = "0.0.0.0:9090",
                                          http_address = "0.0.0.0:8000", served_model_name;
  std::string policy = "full", budget = "1", device_name = "cpu", scheduling = "fair";
  PolicyDefaultFlags policy_defaults;
  DtypeFlags dtypes;
  int64_t block_size = 16, kv_pages = 0, kv_pool_mb = 0, max_step_tokens = 512, max_running = 64;
  int64_t max_n = 16;
  int64_t max_waiting = 256, max_prompt_tokens = 0, max_new_tokens_limit = 0, threads = 0;
  int64_t max_prompt_bytes = 0, max_streams_per_connection = 128, http_threads = 2;
  int64_t max_model_len = 0;
  double kv_memory_fraction = 0.5;
  int64_t http_max_connections = 16384, http_max_connections_per_client = 4096;
  double recent_fraction = 0.5, grace = 30, full_overcommit = 1.0, max_connection_age = 0;
  double http_header_timeout = 10, http_body_timeout = 30, http_idle_timeout = 5;
  double stream_stall_timeout = 30;
  server::ServerTls tls;
  std::string api_key_file, http_cors_origins;
  bool reflection = false;
  bool no_prefix_cache = false, prefix_cache_share_tenants = false;
  FlagSet flags("serve", "heavykv serve --model FILE [--tokenizer FILE] [flags]");
  flags.String("model", &model_path, "llama2.c checkpoint or GGUF file (required)");
  flags.String("tokenizer", &tokenizer_path,
               "llama2.c tokenizer (default: a GGUF model's own); else requests send ids");
  flags.String("chat-template", &chat_template_path,
               "Jinja chat template for Chat (default: the GGUF model's tokenizer.chat_template)");
  flags.String("listen", &listen, "gRPC address host:port (port 0: any free port)");
  flags.String("metrics-address", &metrics_address,
               "Prometheus /metrics address host:port; empty = off");
  flags.String("http-address", &http_address,
               "OpenAI-compatible HTTP API address host:port (/v1/completions, "
               "/v1/chat/completions, ...); empty = off");
  flags.Int("http-threads", &http_threads,
            "HTTP CPU pool: parsing bodies, /tokenize, formatting stream events (connections and "
            "streams hold no thread)");
  flags.Int("http-max-connections", &http_max_connections,
            "HTTP connections open at once; more get 503 (lowered to fit `ulimit -n`)");
  flags.Int("http-max-connections-per-client", &http_max_connections_per_client,
            "HTTP connections open at once from one client address; more get 429");
  flags.Double("http-header-timeout", &http_header_timeout,
               "seconds for a request's line and headers to arrive (from connect, or from its "
               "first byte on a kept-alive connection); then 408");
  flags.Double("http-body-timeout", &http_body_timeout,
               "seconds for a request's body to arrive after its headers; then 408");
  flags.Double("http-idle-timeout", &http_idle_timeout,
               "seconds a kept-alive HTTP connection may wait for its next request");
  flags.Double("stream-stall-timeout", &stream_stall_timeout,
               "seconds a streaming client (gRPC or HTTP) may read nothing while its answer "
               "waits; its generation is paused meanwhile, then cancelled and its pages freed");
  flags.String("http-cors-origins", &http_cors_origins,
               "browser origins that may call the HTTP API (CORS): '*' or a comma list of "
               "scheme://host[:port]; empty = off");
  flags.String("served-model-name", &served_model_name,
               "the model's name in the HTTP API (default: the model file's name)");
  flags.Int("block-size", &block_size, "token slots per KV page");
  flags.Int("kv-pages", &kv_pages,
            "KV pool size in pages; 0 = --kv-pool-mb, else --kv-memory-fraction (cpu) or free "
            "GPU memory minus the weights and a reserve of max(1 GiB, 10%) (cuda)");
  flags.Int("kv-pool-mb", &kv_pool_mb, "KV pool size in MiB (if --kv-pages is 0)");
  flags.Double("kv-memory-fraction", &kv_memory_fraction,
               "cpu only: without --kv-pages/--kv-pool-mb the KV pool takes this share of the "
               "host memory available after the weights, at most --max-running full contexts");
  flags.Int("max-model-len", &max_model_len,
            "context length served (prompt + new tokens per sequence), at most the model's; "
            "0 = the model's");
  flags.String("policy", &policy,
               "default KV policy: full, window, sink, h2o, tova, scissorhands, knorm, snapkv "
               "(name[:key=value]...)");
  flags.String("kv-budget", &budget,
               "default KV budget: tokens, or a fraction of each request's length");
  flags.Double("recent-fraction", &recent_fraction,
               "default share of the budget kept for recent tokens (h2o, scissorhands, snapkv)");
  policy_defaults.Register(flags);
  flags.Int("max-step-tokens", &max_step_tokens,
            "tokens per engine step (decodes + prefill chunks)");
  flags.Int("max-running", &max_running, "most sequences in the running batch");
  flags.Int("max-waiting", &max_waiting, "queue limit; beyond it requests get RESOURCE_EXHAUSTED");
  flags.Int("max-n", &max_n, "most choices (n) a request may ask for; at most --max-waiting");
  flags.Int("max-prompt-tokens", &max_prompt_tokens,
            "longest prompt accepted; 0 = context length - 1");
  flags.Int("max-prompt-bytes", &max_prompt_bytes,
            "longest prompt text accepted in bytes, checked before tokenizing (Generate and "
            "Tokenize); 0 = max-prompt-tokens x the tokenizer's longest piece");
  flags.Int("max-streams-per-connection", &max_streams_per_connection,
            "concurrent streams one client connection may open (HTTP/2 "
            "SETTINGS_MAX_CONCURRENT_STREAMS); further ones wait in the client");
  flags.Int("max-new-tokens-limit", &max_new_tokens_limit,
            "largest max_new_tokens accepted; 0 = context length (raise it to let window and "
            "sink requests stream past the context)");
  flags.Double("full-overcommit", &full_overcommit,
               "admit full-cache requests while their possible growth is within this multiple "
               "of the pool; 1 never preempts them, more bets on early EOS");
  flags.String("scheduling", &scheduling,
               "fair: admission shares the batch between clients (API keys, else connections), "
               "preempting a flooding one; fcfs: first come first served");
  flags.Int("threads", &threads, "CPU threads; 0 = every core");
  flags.String("device", &device_name, "cpu or cuda: where the weights, KV pool and forward pass run");
  dtypes.Register(flags);
  flags.Double("grace", &grace, "seconds running requests get to finish on SIGTERM/SIGINT");
  flags.Double("max-connection-age", &max_connection_age,
               "seconds after which a client connection is asked to reconnect (GOAWAY; its "
               "open streams finish), so clients balancing over a headless Service reach new "
               "replicas; 0 = never");
  flags.String("tls-cert", &tls.cert,
               "PEM server certificate (chain); with --tls-key: gRPC over TLS");
  flags.String("tls-key", &tls.key, "PEM private key of --tls-cert");
  flags.String("tls-client-ca", &tls.client_ca,
               "PEM CA; clients must present a certificate it signed (mutual TLS)");
  flags.String("api-key-file", &api_key_file,
               "file of API keys, one a line (# comments); every Generation call must send "
               "`authorization: Bearer KEY`; SIGHUP reloads it");
  flags.Bool("no-prefix-cache", &no_prefix_cache,
             "turn automatic prefix caching off (on by default on the CPU: prompt blocks stay "
             "in the KV pool and later prompts that start with them skip their prefill)");
  flags.Bool("prefix-cache-share-tenants", &prefix_cache_share_tenants,
             "with --api-key-file, let requests of different API keys reuse each other's "
             "cached prompt prefixes (default: each key sees only its own)");
  flags.Bool("reflection", &reflection, "serve gRPC server reflection (not with --api-key-file)");
  if (std::optional<int> code = ParseOrExit(flags, argc, argv)) return *code;
  if (model_path.empty()) return Fail(absl::InvalidArgumentError("--model is required"));
  absl::StatusOr<Device> device = ParseDevice(device_name);
  if (!device.ok()) return Fail(device.status());
  if (absl::Status s = dtypes.Resolve(*device); !s.ok()) return Fail(s);
  if (absl::Status s = CheckDevice(*device); !s.ok()) return Fail(s);
  for (absl::Status s : {CheckRange("block-size", block_size, 1, 1024),
                         CheckRange("max-step-tokens", max_step_tokens, 1, 1 << 20),
                         CheckRange("max-running", max_running, 1, 1 << 16),
                         CheckRange("max-waiting", max_waiting, 1, 1 << 24),
                         CheckRange("max-n", max_n, 1, 1024),
                         CheckRange("max-prompt-bytes", max_prompt_bytes, 0, int64_t(1) << 30),
                         CheckRange("max-streams-per-connection", max_streams_per_connection, 1,
                                    1 << 20),
                         CheckRange("max-prompt-tokens", max_prompt_tokens, 0, INT32_MAX),
                         CheckRange("max-new-tokens-limit", max_new_tokens_limit, 0, INT32_MAX),
                         CheckRange("threads", threads, 0, 4096),
                         CheckRange("max-model-len", max_model_len, 0, INT32_MAX),
                         CheckRange("http-threads", http_threads, 1, 4096),
                         CheckRange("http-max-connections", http_max_connections, 1, 1 << 20),
                         CheckRange("http-max-connections-per-client",
                                    http_max_connections_per_client, 1, 1 << 20)}) {
    if (!s.ok()) return Fail(s);
  }
  // The three addresses, checked alike before anything loads (docs/ARCHITECTURE.md, "The
  // addresses of serve"); only gRPC takes DNS names.
  absl::StatusOr<ListenAddress> grpc_address = ParseListenAddress("listen", listen, true);
  if (!grpc_address.ok()) return Fail(grpc_address.status());
  for (const auto& [flag, value] : {std::pair{"http-address", &http_address},
                                    std::pair{"metrics-address", &metrics_address}}) {
    if (value->empty()) continue;
    if (absl::StatusOr<ListenAddress> a = ParseListenAddress(flag, *value, false); !a.ok()) {
      return Fail(a.status());
    }
  }
  absl::StatusOr<server::CorsPolicy> cors = server::ParseCorsOrigins(http_cors_origins);
  if (!cors.ok()) return Fail(cors.status());
  if (scheduling != "fair" && scheduling != "fcfs") {
    return Fail(absl::InvalidArgumentError("--scheduling must be fair or fcfs"));
  }
  if (!(grace >= 0)) return Fail(absl::InvalidArgumentError("--grace must be >= 0 seconds"));
  for (const auto& [name, seconds] : {std::pair{"http-header-timeout", http_header_timeout},
                                      std::pair{"http-body-timeout", http_body_timeout},
                                      std::pair{"http-idle-timeout", http_idle_timeout},
                                      std::pair{"stream-stall-timeout", stream_stall_timeout}}) {
    if (!(seconds > 0 && seconds <= 86400)) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--", name, " must be in (0, 86400] seconds")));
    }
  }
  if (!(max_connection_age >= 0 && max_connection_age <= 1e6)) {
    return Fail(absl::InvalidArgumentError("--max-connection-age must be in [0, 1e6] seconds"));
  }
  if (!(kv_memory_fraction > 0 && kv_memory_fraction <= 1)) {
    return Fail(absl::InvalidArgumentError("--kv-memory-fraction must be in (0, 1]"));
  }
  if (*device != Device::kCpu && flags.IsSet("kv-memory-fraction")) {
    return Fail(absl::InvalidArgumentError(
        "--kv-memory-fraction sizes the CPU pool; on cuda the pool takes the free GPU memory, "
        "or give --kv-pool-mb"));
  }
  if (!(full_overcommit >= 1 && full_overcommit <= 100)) {
    return Fail(absl::InvalidArgumentError("--full-overcommit must be in [1, 100]"));
  }

  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      server::ServerCredentials(tls);
  if (!credentials.ok()) return Fail(credentials.status());
  server::ApiKeyStore api_keys;
  if (!api_key_file.empty()) {
    if (reflection) {
      return Fail(absl::InvalidArgumentError(
          "--reflection with --api-key-file: the reflection service cannot check API keys, so "
          "it would describe the API to anyone; drop --reflection"));
    }
    if (absl::Status s = api_keys.Load(api_key_file); !s.ok()) return Fail(s);
  }

  // SIGTERM/SIGINT start the drain whichever thread the kernel delivers them to. A signal mask
  // cannot promise that: OpenBLAS starts its threads when it loads, before main(), and a signal
  // such a thread takes would kill the process. A handler runs in any thread; it only writes
  // the signal number into a pipe, which the main thread waits on below.
  if (absl::Status s = InstallDrainSignals(); !s.ok()) return Fail(s);

  const std::optional<int64_t> available_before_load = AvailableHostMemoryBytes();
  absl::StatusOr<Model> model = LoadModel(model_path, dtypes.weights);
  if (!model.ok()) return Fail(model.status());
  const int32_t model_context = model->config.seq_len;
  if (max_model_len > model_context) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--max-model-len ", max_model_len, " is more than the model's context length ",
        model_context, "; give at most ", model_context, " (or 0 for the model's)")));
  }
  // Serve a shorter context: every per-sequence limit (reservation, prompt, new tokens) and the
  // pool's default follow the config's seq_len.
  if (max_model_len > 0) model->config.seq_len = static_cast<int32_t>(max_model_len);
  if (max_model_len > 0 && max_prompt_tokens >= max_model_len) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--max-prompt-tokens ", max_prompt_tokens, " leaves no room in --max-model-len ",
        max_model_len, ": give at most ", max_model_len - 1, " (0: that)")));
  }
  const ModelConfig c = model->config;
  absl::StatusOr<std::shared_ptr<const TextTokenizer>> tok =
      LoadOptionalTokenizer(tokenizer_path, model_path, c.vocab_size);
  if (!tok.ok()) return Fail(tok.status());
  absl::StatusOr<std::shared_ptr<const ChatTemplate>> chat_template =
      LoadChatTemplate(chat_template_path, model_path);
  if (!chat_template.ok()) return Fail(chat_template.status());
  const KvShape shape = KvShapeForDevice(*device, c, static_cast<int32_t>(block_size), dtypes.kv);
  ServePoolRequest pool_request{.shape = shape,
                                .context = c.seq_len,
                                .max_running = max_running,
                                .max_step_tokens = max_step_tokens,
                                .kv_pages = kv_pages,
                                .kv_pool_mb = kv_pool_mb,
                                .memory_fraction = kv_memory_fraction,
                                .host_pool = *device == Device::kCpu,
                                .model_path = model_path};
  if (available_before_load) {
    pool_request.available_after_weights = *available_before_load - model->HeldBytes();
  }
  if (*device == Device::kCuda && kv_pages == 0 && kv_pool_mb == 0) {
    absl::StatusOr<int32_t> fit =
        DefaultKvPages(*device, *model, shape, {.gpu_weights = dtypes.gpu_weights});
    if (!fit.ok()) return Fail(fit.status());
    pool_request.device_default_pages = *fit;
  }
  absl::StatusOr<ServePool> pool = SizeServePool(pool_request);
  if (!pool.ok()) return Fail(pool.status());

  auto metrics = std::make_shared<server::Metrics>();
  EngineOptions options;
  options.observer = metrics.get();
  options.block_size = static_cast<int32_t>(block_size);
  options.num_pages = pool->pages;
  options.max_step_tokens = static_cast<int32_t>(max_step_tokens);
  options.max_running = static_cast<int32_t>(max_running);
  options.max_waiting = static_cast<int32_t>(max_waiting);
  options.max_n = static_cast<int32_t>(max_n);
  options.max_prompt_tokens = static_cast<int32_t>(max_prompt_tokens);
  options.max_prompt_bytes = max_prompt_bytes;
  options.max_new_tokens_limit = static_cast<int32_t>(max_new_tokens_limit);
  options.full_overcommit = full_overcommit;
  options.fair_share = scheduling == "fair";
  options.default_policy = policy;
  options.default_budget = budget;
  options.default_recent_fraction = recent_fraction;
  if (absl::Status s = policy_defaults.Resolve(); !s.ok()) return Fail(s);
  options.evict_granularity = policy_defaults.granularity;
  options.layer_budgets = policy_defaults.layers;
  options.threads = static_cast<int>(threads);
  options.device = device_name;
  options.kv_dtype = dtypes.kv_name;
  options.gpu_weights = dtypes.gpu_weights;
  options.prefix_cache = !no_prefix_cache;
  options.prefix_cache_share_tenants = prefix_cache_share_tenants;
  options.chat_template = *chat_template;
  options.stall_timeout = absl::Seconds(stream_stall_timeout);
  const std::string tokenizer_name =
      *tok == nullptr ? "none (token ids only)"
                      : absl::StrCat((*tok)->Describe(), ", ",
                                     tokenizer_path.empty() ? model_path : tokenizer_path);
  const std::string chat_template_name =
      *chat_template == nullptr ? "none (Chat unavailable)"
      : chat_template_path.empty() ? "the model's"
                                   : chat_template_path;
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(*std::move(model), std::move(*tok), options);
  if (!engine.ok()) return Fail(engine.status());
  metrics->SetStatsSource([e = engine->get()] { return e->Stats(); });

  std::unique_ptr<server::HttpServer> metrics_http;
  std::string metrics_bound = "off";
  if (!metrics_address.empty()) {
    absl::StatusOr<std::unique_ptr<server::HttpServer>> http =
        server::StartMetricsHttp(metrics_address, metrics);
    if (!http.ok()) return FailToListen(http.status());
    metrics_http = *std::move(http);
    metrics_bound = WithPort(metrics_address, metrics_http->port());
  }

  auto draining = std::make_shared<std::atomic<bool>>(false);
  std::unique_ptr<server::HttpServer> openai_http;
  std::string http_bound = "off";
  if (!http_address.empty()) {
    server::OpenAiHttpOptions http_options;
    http_options.address = http_address;
    http_options.model_name = served_model_name.empty()
                                  ? std::filesystem::path(model_path).filename().string()
                                  : served_model_name;
    http_options.threads = static_cast<int>(http_threads);
    http_options.max_connections = static_cast<int>(http_max_connections);
    http_options.max_connections_per_client = static_cast<int>(http_max_connections_per_client);
    http_options.header_timeout = absl::Seconds(http_header_timeout);
    http_options.body_timeout = absl::Seconds(http_body_timeout);
    http_options.idle_timeout = absl::Seconds(http_idle_timeout);
    http_options.write_timeout = absl::Seconds(stream_stall_timeout);
    http_options.api_keys = api_key_file.empty() ? nullptr : &api_keys;
    http_options.metrics = metrics;
    http_options.cors = *cors;
    http_options.on_rejected = [m = metrics.get()](absl::StatusCode code) {
      m->OnRejected(absl::StatusCodeToString(code));
    };
    absl::StatusOr<std::unique_ptr<server::HttpServer>> http =
        server::StartOpenAiHttp(engine->get(), http_options, draining);
    if (!http.ok()) return FailToListen(http.status());
    openai_http = *std::move(http);
    http_bound = WithPort(http_address, openai_http->port());
    metrics->SetHttpStatsSource([h = openai_http.get()] { return h->Stats(); });
  }

  server::GenerationService service(
      engine->get(), {policy, budget},
      [m = metrics.get()](absl::StatusCode code) { m->OnRejected(absl::StatusCodeToString(code)); },
      api_key_file.empty() ? server::CallAuthenticator()
                           : [&api_keys](const grpc::CallbackServerContext& context,
                                         std::string_view method) {
                               return api_keys.CheckCall(context, method);
                             });
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  server::ConfigureReflection(&builder, reflection);
  int port = 0;
  builder.AddListeningPort(listen, *credentials, &port);
  // Exclusive: gRPC's default SO_REUSEPORT would let a second server bind this port too and take
  // part of the first one's clients.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             static_cast<int>(max_streams_per_connection));
  if (max_connection_age > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS,
                               static_cast<int>(max_connection_age * 1000));
    // Streams open at the GOAWAY run to completion, however long a generation takes.
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, INT_MAX);
  }
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    const std::string reason = BindFailureReason(*grpc_address);
    return FailToListen(absl::UnavailableError(absl::StrCat(
        "cannot listen on ", listen, reason.empty() ? "" : ": ", reason,
        "; choose another --listen address",
        tls.enabled() && reason.empty() ? " (or check that --tls-key is the key of --tls-cert)"
                                        : "")));
  }
  server->GetHealthCheckService()->SetServingStatus(true);

  const ModelInfo info = (*engine)->Info();
  spdlog::info(
      "heavykv serve: model {} (dim {}, {} layers, {} heads / {} kv heads, vocab {}, "
      "context {}{}), tokenizer {}, chat template {}",
      model_path, c.dim, c.num_layers, c.num_heads, c.num_kv_heads, c.vocab_size, c.seq_len,
      c.seq_len < model_context ? absl::StrCat(" of ", model_context, " (--max-model-len)") : "",
      tokenizer_name, chat_template_name);
  spdlog::info("KV pool on {}: {}", device_name, DescribeServePool(pool_request, *pool));
  spdlog::info("default policy {} budget {}; max running {}, step tokens {}, queue {}", policy,
               budget, max_running, max_step_tokens, max_waiting);
  if (!info.device_weight_bytes.empty()) {
    spdlog::info("weights on {} (--gpu-weights {}): {}", device_name,
                 std::string(GpuWeightsName(dtypes.gpu_weights)),
                 FormatBytesByFormat(info.device_weight_bytes));
  }
  spdlog::info("gRPC security: {}; API keys {}; reflection {}", server::DescribeTls(tls),
               api_key_file.empty() ? std::string("off (no authentication)")
                                    : absl::StrCat("on (", api_keys.size(), " from ",
                                                   api_key_file, ")"),
               reflection ? "on" : "off");
  if (openai_http != nullptr && cors->enabled()) {
    spdlog::info("OpenAI HTTP CORS: browser origins {} may call the API", http_cors_origins);
  }
  if (openai_http != nullptr && tls.enabled()) {
    spdlog::warn("the OpenAI HTTP API on {} is plaintext (--tls-* cover gRPC only): bind it to "
                 "loopback behind a TLS proxy, or turn it off with --http-address ''",
                 http_bound);
  }
  // Drain from here on; set before the line below, which callers (deploy checks, scripts) take as
  // "up": a SIGTERM sent on seeing it must drain, not kill.
  serving = 1;
  spdlog::info("gRPC listening on {}; metrics on {}; OpenAI HTTP on {}", WithPort(listen, port),
               metrics_bound, http_bound);

  int sig;
  while ((sig = WaitForDrainSignal()) == SIGHUP) {
    if (api_key_file.empty()) {
      spdlog::info("SIGHUP: no --api-key-file to reload");
    } else {
      api_keys.ReloadAndLog();
    }
  }
  spdlog::info("signal {}: draining (grace {:.1f}s)", sig, grace);
  server->GetHealthCheckService()->SetServingStatus(false);
  draining->store(true);  // HTTP /health: 503
  (*engine)->Shutdown(absl::Seconds(grace));  // new requests: UNAVAILABLE; the rest cancelled
  // Every stream has had its last delta; one second lets those writes reach the clients. (gRPC
  // also waits out this deadline while idle client connections stay open, so keep it short.)
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server->Wait();
  if (openai_http != nullptr) openai_http->Stop();  // every HTTP request has had its last delta
  if (metrics_http != nullptr) metrics_http->Stop();
  spdlog::info("heavykv serve: stopped");
  return 0;
}

}  // namespace heavykv::cli
