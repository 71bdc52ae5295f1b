// The `heavykv` subcommands. Each parses its own flags from argv[2..] and returns the process
// exit code; errors are printed to stderr as one line that says what to change.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/chat/chat_template.h"
#include "engine/model/model.h"
#include "engine/tokenizer/text_tokenizer.h"
#include "memory/kv_cache.h"

namespace heavykv::cli {

int RunCommand(int argc, char** argv);        // heavykv run
int EvalCommand(int argc, char** argv);       // heavykv eval
int MakeModelCommand(int argc, char** argv);  // heavykv make-model
int ServeCommand(int argc, char** argv);      // heavykv serve (cmd_serve.cc)
int GenerateCommand(int argc, char** argv);   // heavykv generate (cmd_generate.cc)
int BenchCommand(int argc, char** argv);      // heavykv bench (cmd_bench.cc)
int PlanCommand(int argc, char** argv);       // heavykv plan (cmd_plan.cc)
int InspectCommand(int argc, char** argv);    // heavykv inspect (cmd_inspect.cc)
int ChatTemplateCommand(int argc, char** argv);  // heavykv chat-template (cmd_chat_template.cc)
int TokenizeCommand(int argc, char** argv);      // heavykv tokenize (cmd_tokenize.cc)
int GrammarCommand(int argc, char** argv);       // heavykv grammar (cmd_grammar.cc)

// Shared by the subcommands.
// The llama2.c tokenizer at `path` (--tokenizer) when given; else a GGUF model's own (engine/
// gguf_tokenizer.h; one that heavykv cannot read is noted on stderr and left out); else null.
absl::StatusOr<std::shared_ptr<const TextTokenizer>> LoadOptionalTokenizer(
    const std::string& path, const std::string& model_path, int32_t vocab_size);
// Only the tokenizer of a model: a GGUF file's own (its vocabulary size from its token list), or
// `tokenizer_path` (llama2.c tokenizer.bin, sized by the checkpoint's header); never the weights.
// An error when the model has none heavykv reads (cmd_tokenize.cc).
absl::StatusOr<std::shared_ptr<const TextTokenizer>> LoadTokenizerOnly(
    const std::string& model_path, const std::string& tokenizer_path);
// Prompt tokens: encoded text (BOS as the tokenizer adds it, special tokens parsed) when a
// tokenizer is given, else whitespace-separated ids (the model's BOS prepended when the list does
// not start with it, unless config.add_bos is false); INVALID_ARGUMENT for an empty result.
absl::StatusOr<std::vector<int32_t>> PromptTokens(const TextTokenizer* tok,
                                                  const std::string& prompt,
                                                  const ModelConfig& config);
// The chat template in `override_path` (--chat-template) when given, else a GGUF model's
// tokenizer.chat_template, else null. A model's template that heavykv cannot parse is noted on
// stderr and left out (Chat then answers FAILED_PRECONDITION); an override that does not parse
// is an error.
absl::StatusOr<std::shared_ptr<const ChatTemplate>> LoadChatTemplate(
    const std::string& override_path, const std::string& model_path);
// Pool size from --kv-pages, else --kv-pool-mb, else `default_pages`.
absl::StatusOr<int32_t> PoolPages(const KvShape& shape, int64_t kv_pages, int64_t kv_pool_mb,
                                  int32_t default_pages);
// Applies --threads (0: every core).
void SetThreads(int64_t threads);

}  // namespace heavykv::cli
