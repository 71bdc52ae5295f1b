// Helpers shared by the libFuzzer targets in tests/fuzz: a scratch file for loaders that take a
// path, and the bundled model's configuration, tokenizer and a KV pool sized like `heavykv serve`'s
// default, for the targets that validate requests. Everything here aborts on a setup failure: a
// fuzzer that cannot start must not pass.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "engine/model/model.h"
#include "engine/serving/engine.h"
#include "engine/serving/request_validation.h"
#include "engine/serving/scheduler.h"
#include "engine/tokenizer/tokenizer.h"
#include "memory/kv_cache.h"

namespace heavykv::fuzz {

[[noreturn]] inline void Die(const std::string& what) {
  std::fprintf(stderr, "fuzz setup failed: %s\n", what.c_str());
  std::abort();
}

// One file per process under $TMPDIR (default /tmp), rewritten for every input and removed at
// exit, so parallel fuzzers (-jobs/-workers) never share one.
class ScratchFile {
 public:
  explicit ScratchFile(const std::string& stem) {
    const char* dir = std::getenv("TMPDIR");
    path_ = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/" + stem + ".XXXXXX";
    const int fd = mkstemp(path_.data());
    if (fd < 0) Die("mkstemp " + path_);
    close(fd);
  }
  ~ScratchFile() { std::remove(path_.c_str()); }

  // Replaces the file's contents with data[0, size).
  const std::string& Write(const uint8_t* data, size_t size) const {
    std::FILE* f = std::fopen(path_.c_str(), "wb");
    if (f == nullptr) Die("cannot open " + path_);
    if (size > 0 && std::fwrite(data, 1, size, f) != size) Die("cannot write " + path_);
    std::fclose(f);
    return path_;
  }

 private:
  std::string path_;
};

// The bundled stories260K model's configuration and tokenizer, a KV pool of 16 full contexts
// and a validator with the server's default options: what `heavykv serve` checks requests with.
struct BundledServer {
  BundledServer() {
    const std::string dir = HEAVYKV_SOURCE_DIR;
    absl::StatusOr<ModelConfig> c = ReadModelConfig(dir + "/models/stories260K.bin");
    if (!c.ok()) Die(std::string(c.status().message()));
    config = *c;
    absl::StatusOr<Tokenizer> t = Tokenizer::Load(dir + "/models/tok512.bin", config.vocab_size);
    if (!t.ok()) Die(std::string(t.status().message()));
    tokenizer = std::make_unique<Tokenizer>(*std::move(t));
    KvShape shape;
    shape.num_layers = config.num_layers;
    shape.num_kv_heads = config.num_kv_heads;
    shape.head_dim = config.head_dim();
    shape.block_size = options.block_size;
    shape.table_per_layer = true;  // the CPU layout, as serve has it
    const int32_t pages = 16 * shape.NumTables() *
                          ((config.seq_len + shape.block_size - 1) / shape.block_size);
    absl::StatusOr<std::unique_ptr<KvCache>> kv = KvCache::Create(shape, pages);
    if (!kv.ok()) Die(std::string(kv.status().message()));
    cache = *std::move(kv);
    options.num_pages = pages;
    // ChatML, as SmolLM2 and Qwen write it, for chat requests.
    absl::StatusOr<ChatTemplate> chat = ChatTemplate::Parse(
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
        "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|im_start|>assistant\\n' }}{% endif %}");
    if (!chat.ok()) Die(std::string(chat.status().message()));
    options.chat_template = std::make_shared<const ChatTemplate>(*std::move(chat));
    scheduler = std::make_unique<Scheduler>(
        cache.get(), SchedulerConfig{options.max_step_tokens, options.max_running,
                                     256, options.full_overcommit});
    validator =
        std::make_unique<RequestValidator>(config, tokenizer.get(), options, scheduler.get());
  }

  ModelConfig config;
  EngineOptions options;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<RequestValidator> validator;
};

// Aborts (a crash libFuzzer reports, with the input) unless `resolved` keeps the promises
// RequestValidator::Resolve makes for an accepted request.
inline void CheckResolved(const BundledServer& server, const ResolvedRequest& r) {
  const ModelConfig& c = server.config;
  if (r.prompt.empty() || r.prompt[0] != kBosId) Die("accepted prompt does not start with BOS");
  for (int32_t id : r.prompt) {
    if (id < 0 || id >= c.vocab_size) Die("accepted prompt id outside the vocabulary");
  }
  for (int32_t id : r.stop_token_ids) {
    if (id < 0 || id >= c.vocab_size) Die("accepted stop id outside the vocabulary");
  }
  if (r.max_new_tokens < 1 || r.max_new_tokens > c.seq_len ||
      int64_t(r.prompt.size()) > c.seq_len) {
    Die("accepted max_new_tokens or a prompt over the context");
  }
  // Past the context only as an endless stream: the window or sink policy (no parameters), on the
  // CPU, with a budget that leaves room for one decode step and keeps more than sink's 4 pinned
  // tokens.
  if (int64_t(r.prompt.size()) + r.max_new_tokens > c.seq_len) {
    const bool streams = server.options.device == "cpu" && r.budget_tokens < c.seq_len &&
                         (r.policy == "window" || (r.policy == "sink" && r.budget_tokens > 4));
    if (!streams) Die("accepted a request longer than the context that cannot stream past it");
  }
  if (!(r.sampling.temperature >= 0) || !(r.sampling.top_p > 0 && r.sampling.top_p <= 1) ||
      r.sampling.top_k < 0 || r.sampling.top_k > c.vocab_size) {
    Die("accepted sampling parameters out of range");
  }
  if (!(r.recent_fraction > 0 && r.recent_fraction <= 1)) Die("accepted a bad recent fraction");
  if (r.top_logprobs < 0 || r.top_logprobs > kMaxTopLogprobs ||
      (r.top_logprobs > 0 && !r.logprobs)) {
    Die("accepted top_logprobs out of range or without logprobs");
  }
  if (r.policy != "full" && r.budget_tokens < 1) Die("accepted a KV budget below one token");
  if ((r.kv_policy == nullptr) != (r.policy == "full")) {
    Die("the resolved policy object does not match the spec (null exactly for full)");
  }
}

}  // namespace heavykv::fuzz
