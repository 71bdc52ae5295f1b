// heavykv: one executable, subcommands like `vllm serve` / `vllm bench`.
#include <cstdio>
#include <cstring>

#include "server/cli/commands.h"

namespace {

constexpr char kUsage[] =
    "usage: heavykv COMMAND [flags]   (heavykv COMMAND --help for its flags)\n"
    "commands:\n"
    "  run         generate text from a prompt on the CPU engine\n"
    "  eval        perplexity of KV policies x budgets against the full cache\n"
    "  make-model  write a random-weight llama2.c checkpoint at a real model's shape\n"
    "  serve       the gRPC inference server (heavykv.v1.Generation) with Prometheus metrics\n"
    "  generate    stream one generation from a running server\n"
    "  bench       load-test a running server: throughput, TTFT and inter-token latency\n"
    "  plan        size the KV pool: bytes per token, pages and sequences per replica\n"
    "  inspect     what a model file (GGUF or llama2.c) holds and whether heavykv runs it\n"
    "  chat-template  render a chat template (Jinja, or a GGUF's own) for a conversation\n"
    "  tokenize    the token ids (and pieces) a model's tokenizer gives a text\n"
    "  grammar     compile and test structured-output constraints against a vocabulary\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "help")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const char* cmd = argv[1];
  if (!std::strcmp(cmd, "run")) return heavykv::cli::RunCommand(argc, argv);
  if (!std::strcmp(cmd, "eval")) return heavykv::cli::EvalCommand(argc, argv);
  if (!std::strcmp(cmd, "make-model")) return heavykv::cli::MakeModelCommand(argc, argv);
  if (!std::strcmp(cmd, "serve")) return heavykv::cli::ServeCommand(argc, argv);
  if (!std::strcmp(cmd, "generate")) return heavykv::cli::GenerateCommand(argc, argv);
  if (!std::strcmp(cmd, "bench")) return heavykv::cli::BenchCommand(argc, argv);
  if (!std::strcmp(cmd, "plan")) return heavykv::cli::PlanCommand(argc, argv);
  if (!std::strcmp(cmd, "inspect")) return heavykv::cli::InspectCommand(argc, argv);
  if (!std::strcmp(cmd, "chat-template")) return heavykv::cli::ChatTemplateCommand(argc, argv);
  if (!std::strcmp(cmd, "tokenize")) return heavykv::cli::TokenizeCommand(argc, argv);
  if (!std::strcmp(cmd, "grammar")) return heavykv::cli::GrammarCommand(argc, argv);
  std::fprintf(stderr, "heavykv: unknown command \"%s\"\n%s", cmd, kUsage);
  return 2;
}
