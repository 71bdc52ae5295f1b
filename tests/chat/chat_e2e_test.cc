// End-to-end tests of the Chat and Tokenize RPCs and of `heavykv tokenize` / `generate --chat`:
// real `heavykv serve` processes on random-weight GGUF models, spoken to with real gRPC.
//
// ChatE2eTest: models with real vocabularies and chat templates (../shared/gguf/qwen-vocab.gguf,
// Qwen3's template; llama3-vocab.gguf, BOS added): a chat streams exactly what Generate streams
// for the prompt `heavykv chat-template` renders, and the server's Tokenize agrees with
// `heavykv tokenize`. Skipped where ../shared/gguf is absent.
// ChatRefusalE2eTest: make-model's minimal SentencePiece vocabulary, which has no chat template:
// Chat is refused until --chat-template gives one, bad chats are INVALID_ARGUMENT and leak
// nothing, and skip_special_tokens decides whether a generated <s> is in the text.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/server/server_harness.h"

namespace heavykv {
namespace {

using namespace heavykv::e2e;
using testing::SourcePath;

using Messages = std::vector<std::pair<std::string, std::string>>;  // (role, content)

// A random GGUF model at a small shape: `flags` say the architecture and the vocabulary.
std::string MakeModel(const std::string& path, const std::string& flags) {
  RunCapture(Bin() +
             " make-model --format gguf --dim 64 --hidden-dim 128 --layers 2 --heads 4 "
             "--kv-heads 2 " +
             flags + " --out " + path + " 2>&1");
  return path;
}

std::string Template(const std::string& name) {
  return SourcePath("tests/data/chat_templates/" + name);
}

v1::ChatRequest GreedyChat(const Messages& messages, int32_t max_new_tokens) {
  v1::ChatRequest req;
  for (const auto& [role, content] : messages) {
    v1::ChatMessage* m = req.add_messages();
    m->set_role(role);
    m->set_content(content);
  }
  req.set_max_new_tokens(max_new_tokens);
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_seed(7);
  return req;
}

std::vector<int32_t> Tokenize(v1::Generation::Stub& stub, const std::string& text,
                              std::optional<bool> add_special = std::nullopt) {
  grpc::ClientContext context;
  v1::TokenizeRequest req;
  req.set_text(text);
  if (add_special.has_value()) req.set_add_special_tokens(*add_special);
  v1::TokenizeResponse resp;
  const grpc::Status s = stub.Tokenize(&context, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return {resp.token_ids().begin(), resp.token_ids().end()};
}

// `heavykv tokenize --ids` (a JSON array) for `text`, with `flags` before it.
std::vector<int32_t> CliIds(const std::string& model, const std::string& flags,
                            const std::string& text) {
  const std::string out =
      RunCapture(Bin() + " tokenize --model " + model + " --ids " + flags + " '" + text + "'");
  const nlohmann::json j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  EXPECT_TRUE(j.is_array()) << out;
  return j.is_array() ? j.get<std::vector<int32_t>>() : std::vector<int32_t>();
}

// What `heavykv chat-template` renders for `messages` from the template `source` names
// ("--model FILE" or "--template FILE").
std::string Render(const testing::TempDir& dir, const std::string& source, const Messages& messages,
                   const std::string& flags = "") {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& [role, content] : messages) j.push_back({{"role", role}, {"content", content}});
  const std::string path = dir.File("messages.json");
  std::ofstream(path) << j.dump();
  return RunCapture(Bin() + " chat-template " + source + " --messages " + path + " " + flags);
}

class ChatE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(QwenVocab()) || !std::filesystem::exists(Llama3Vocab())) return;
    dir_ = new testing::TempDir();
    // An untied classifier: the tied random model repeats one token, this one varies.
    qwen_model_ = MakeModel(dir_->File("qwen.gguf"),
                            "--arch qwen2 --tied=false --seq-len 512 --vocab-from " + QwenVocab());
    llama3_model_ = MakeModel(dir_->File("llama3.gguf"),
                              "--arch llama --seq-len 512 --vocab-from " + Llama3Vocab());
    qwen_ = new ServerProcess({"--model", qwen_model_, "--threads", "1"});
    llama3_ = new ServerProcess({"--model", llama3_model_, "--threads", "1"});
  }
  static void TearDownTestSuite() {
    delete qwen_;
    delete llama3_;
    delete dir_;
  }
  void SetUp() override {
    if (dir_ == nullptr)
      GTEST_SKIP() << "../shared/gguf has no qwen-vocab.gguf / llama3-vocab.gguf";
    ASSERT_TRUE(qwen_->ok()) << qwen_->log();
    ASSERT_TRUE(llama3_->ok()) << llama3_->log();
  }

  static std::string QwenVocab() { return SourcePath("../shared/gguf/qwen-vocab.gguf"); }
  static std::string Llama3Vocab() { return SourcePath("../shared/gguf/llama3-vocab.gguf"); }

  static testing::TempDir* dir_;
  static std::string qwen_model_, llama3_model_;
  static ServerProcess* qwen_;
  static ServerProcess* llama3_;
};
testing::TempDir* ChatE2eTest::dir_ = nullptr;
std::string ChatE2eTest::qwen_model_;
std::string ChatE2eTest::llama3_model_;
ServerProcess* ChatE2eTest::qwen_ = nullptr;
ServerProcess* ChatE2eTest::llama3_ = nullptr;

TEST_F(ChatE2eTest, ChatStreamsWhatGenerateStreamsForTheRenderedPrompt) {
  const Messages messages = {
      {"system", "You are terse. Réponds en français."},
      {"user", "Grüß dich! 你好 🙂 What is 2+2?"},
      {"assistant", "Four — «quatre»."},
      {"user", "And in 日本語?"},
  };
  const std::string rendered = Render(*dir_, "--model " + qwen_model_, messages);
  ASSERT_TRUE(rendered.ends_with("<|im_start|>assistant\n")) << rendered;
  ASSERT_NE(rendered.find("«quatre»"), std::string::npos) << rendered;

  const Streamed chat = Chat(qwen_->stub(), GreedyChat(messages, 24));
  ASSERT_TRUE(chat.status.ok()) << chat.status.error_message();
  v1::GenerateRequest gen_req = Greedy(rendered, 24);
  gen_req.mutable_sampling()->set_seed(7);
  const Streamed gen = Generate(qwen_->stub(), gen_req);
  ASSERT_TRUE(gen.status.ok()) << gen.status.error_message();

  EXPECT_FALSE(chat.text.empty());
  EXPECT_GT(chat.messages, 1);  // streamed, not one reply
  EXPECT_EQ(chat.ids, gen.ids);
  EXPECT_EQ(chat.text, gen.text);
  EXPECT_EQ(chat.last.finish_reason(), gen.last.finish_reason());
  // Qwen adds no BOS: the prompt is exactly the rendered text's tokens.
  const std::vector<int32_t> prompt = Tokenize(qwen_->stub(), rendered);
  EXPECT_EQ(prompt.front(), 151644);  // <|im_start|>
  EXPECT_EQ(chat.last.usage().prompt_tokens(), int32_t(prompt.size()));
  EXPECT_EQ(gen.last.usage().prompt_tokens(), int32_t(prompt.size()));
  EXPECT_EQ(chat.last.usage().completion_tokens(), int32_t(chat.ids.size()));

  // add_generation_prompt = false renders the conversation as it stands.
  v1::ChatRequest as_is = GreedyChat(messages, 4);
  as_is.set_add_generation_prompt(false);
  const Streamed no_header = Chat(qwen_->stub(), as_is);
  ASSERT_TRUE(no_header.status.ok()) << no_header.status.error_message();
  const std::string rendered_as_is =
      Render(*dir_, "--model " + qwen_model_, messages, "--no-generation-prompt");
  EXPECT_FALSE(rendered_as_is.ends_with("<|im_start|>assistant\n"));
  EXPECT_EQ(no_header.last.usage().prompt_tokens(),
            int32_t(Tokenize(qwen_->stub(), rendered_as_is).size()));
}

TEST_F(ChatE2eTest, GenerateChatFlagPrintsTheChatStream) {
  const Messages messages = {{"system", "Sei kurz."}, {"user", "Wie heißt du? 🙂"}};
  const Streamed chat = Chat(qwen_->stub(), GreedyChat(messages, 16));
  ASSERT_TRUE(chat.status.ok()) << chat.status.error_message();
  EXPECT_EQ(RunCapture(Bin() + " generate --server " + qwen_->address() +
                       " --chat --system 'Sei kurz.' --temperature 0 --seed 7 --max-tokens 16 "
                       "'Wie heißt du? 🙂' 2>/dev/null"),
            chat.text + "\n");
  int code = 0;
  RunCapture(Bin() + " generate --server " + qwen_->address() + " --system x hi 2>/dev/null",
             &code);
  EXPECT_NE(code, 0) << "--system without --chat";
}

TEST_F(ChatE2eTest, TokenizeRpcMatchesTheCli) {
  // A special token inside the text is that one token; non-ASCII text is byte-level BPE.
  const std::string qwen_text = "hi<|im_end|>there héllo 日本 🙂";
  const std::vector<int32_t> qwen_ids = Tokenize(qwen_->stub(), qwen_text);
  EXPECT_EQ(qwen_ids, CliIds(qwen_model_, "", qwen_text));
  EXPECT_EQ(std::count(qwen_ids.begin(), qwen_ids.end(), 151645), 1);  // <|im_end|>
  EXPECT_EQ(Tokenize(qwen_->stub(), qwen_text, false), CliIds(qwen_model_, "--no-bos", qwen_text));
  EXPECT_EQ(Tokenize(qwen_->stub(), qwen_text, false), qwen_ids);  // Qwen has no BOS

  const std::string llama3_text = "hi<|eot_id|>there héllo 日本";
  const std::vector<int32_t> with_bos = Tokenize(llama3_->stub(), llama3_text);
  const std::vector<int32_t> without = Tokenize(llama3_->stub(), llama3_text, false);
  EXPECT_EQ(with_bos, CliIds(llama3_model_, "", llama3_text));
  EXPECT_EQ(without, CliIds(llama3_model_, "--no-bos", llama3_text));
  ASSERT_FALSE(with_bos.empty());
  EXPECT_EQ(with_bos.front(), 128000);  // <|begin_of_text|>
  EXPECT_EQ(std::vector<int32_t>(with_bos.begin() + 1, with_bos.end()), without);
  EXPECT_EQ(std::count(without.begin(), without.end(), 128009), 1);  // <|eot_id|>

  // The default output: one "ID<TAB>PIECE" line per token, control bytes escaped.
  const std::string lines = RunCapture(Bin() + " tokenize --model " + llama3_model_ + " 'a\nb'");
  EXPECT_EQ(lines, "128000\t<|begin_of_text|>\n64\ta\n198\t\\x0a\n65\tb\n");
  int code = 0;
  RunCapture(Bin() + " tokenize --model " + dir_->File("missing.gguf") + " x 2>/dev/null", &code);
  EXPECT_NE(code, 0);
}

class ChatRefusalE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    // make-model's own SentencePiece vocabulary (<unk> <s> </s>, bytes, ASCII): no chat
    // template. With this seed the greedy continuation of "a" generates <s> (id 1) within 150
    // tokens, which does not end a GGUF model's generation.
    model_ = MakeModel(dir_->File("plain.gguf"),
                       "--arch llama --tied=false --seed 4 --vocab 300 --seq-len 256");
    plain_ = new ServerProcess({"--model", model_, "--threads", "1"});
    chatml_ = new ServerProcess(
        {"--model", model_, "--threads", "1", "--chat-template", Template("qwen2.5.jinja")});
    llama2_ = new ServerProcess(
        {"--model", model_, "--threads", "1", "--chat-template", Template("llama2.jinja")});
  }
  static void TearDownTestSuite() {
    delete plain_;
    delete chatml_;
    delete llama2_;
    delete dir_;
  }
  void SetUp() override {
    ASSERT_TRUE(plain_->ok()) << plain_->log();
    ASSERT_TRUE(chatml_->ok()) << chatml_->log();
    ASSERT_TRUE(llama2_->ok()) << llama2_->log();
  }

  static testing::TempDir* dir_;
  static std::string model_;
  static ServerProcess* plain_;
  static ServerProcess* chatml_;
  static ServerProcess* llama2_;
};
testing::TempDir* ChatRefusalE2eTest::dir_ = nullptr;
std::string ChatRefusalE2eTest::model_;
ServerProcess* ChatRefusalE2eTest::plain_ = nullptr;
ServerProcess* ChatRefusalE2eTest::chatml_ = nullptr;
ServerProcess* ChatRefusalE2eTest::llama2_ = nullptr;

TEST_F(ChatRefusalE2eTest, WithoutATemplateChatIsFailedPreconditionUntilChatTemplateGivesOne) {
  const std::string inspect = RunCapture(Bin() + " inspect " + model_);
  ASSERT_NE(inspect.find("tokenizer.ggml.model"), std::string::npos) << inspect;
  ASSERT_EQ(inspect.find("chat_template"), std::string::npos) << inspect;

  const Streamed refused = Chat(plain_->stub(), GreedyChat({{"user", "hi"}}, 8));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(refused.status.error_message().find("--chat-template"), std::string::npos)
      << refused.status.error_message();
  EXPECT_TRUE(refused.ids.empty());
  const Streamed gen = Generate(plain_->stub(), Greedy("hi", 8));
  ASSERT_TRUE(gen.status.ok()) << gen.status.error_message();
  EXPECT_EQ(gen.ids.size(), 8u);

  const Streamed chat = Chat(chatml_->stub(), GreedyChat({{"user", "hi"}}, 8));
  ASSERT_TRUE(chat.status.ok()) << chat.status.error_message();
  EXPECT_EQ(chat.ids.size(), 8u);
  // qwen2.5's template adds its default system message: the prompt is the whole rendering.
  const std::string rendered =
      Render(*dir_, "--template " + Template("qwen2.5.jinja"), {{"user", "hi"}});
  EXPECT_NE(rendered.find("<|im_start|>system\n"), std::string::npos) << rendered;
}

TEST_F(ChatRefusalE2eTest, SkipSpecialTokensDecidesWhetherControlTokensAreInTheText) {
  v1::GenerateRequest req = Greedy("a", 150);
  const Streamed skipped = Generate(plain_->stub(), req);
  req.set_skip_special_tokens(false);
  const Streamed kept = Generate(plain_->stub(), req);
  ASSERT_TRUE(skipped.status.ok()) << skipped.status.error_message();
  ASSERT_TRUE(kept.status.ok()) << kept.status.error_message();
  ASSERT_EQ(skipped.ids, kept.ids);
  const auto bos = std::count(kept.ids.begin(), kept.ids.end(), 1);
  ASSERT_GT(bos, 0) << "the greedy continuation no longer generates <s>";
  std::string without = kept.text;
  for (size_t at; (at = without.find("<s>")) != std::string::npos;) without.erase(at, 3);
  EXPECT_EQ(skipped.text, without);
  EXPECT_EQ(kept.text.size(), skipped.text.size() + 3 * size_t(bos));

  // Chat takes the field too.
  v1::ChatRequest chat = GreedyChat({{"user", "a"}}, 8);
  chat.set_skip_special_tokens(false);
  const Streamed c = Chat(chatml_->stub(), chat);
  ASSERT_TRUE(c.status.ok()) << c.status.error_message();
  EXPECT_EQ(c.ids.size(), 8u);
}

TEST_F(ChatRefusalE2eTest, BadChatsAreInvalidArgumentAndLeakNothing) {
  // The template's raise_exception: its message is the status's.
  const Streamed raised = Chat(llama2_->stub(), GreedyChat({{"user", "a"}, {"user", "b"}}, 8));
  EXPECT_EQ(raised.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(raised.status.error_message().find(
                "Conversation roles must alternate user/assistant/user/assistant/..."),
            std::string::npos)
      << raised.status.error_message();

  Messages many;
  for (int i = 0; i < 1025; ++i) many.emplace_back(i % 2 ? "assistant" : "user", "x");
  const std::vector<std::pair<std::string, Messages>> bad = {
      {"no messages", {}},
      {"1025 messages", many},
      {"a 65-byte role", {{std::string(65, 'r'), "hi"}}},
      {"an empty role", {{"", "hi"}}},
      {"invalid UTF-8", {{"user", "ok \xff\xfe"}}},
      {"invalid UTF-8 in the role", {{"us\xc3", "hi"}}},
  };
  for (const auto& [what, messages] : bad) {
    const Streamed s = Chat(llama2_->stub(), GreedyChat(messages, 8));
    EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << what << ": " << s.status.error_message();
    EXPECT_TRUE(s.ids.empty()) << what;
  }

  const Streamed ok = Chat(llama2_->stub(), GreedyChat({{"user", "hi"}}, 8));
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.ids.size(), 8u);
  const v1::CacheStats stats = llama2_->Stats();  // the pages are back before the final message
  EXPECT_EQ(stats.pages_used(), 0);
  EXPECT_EQ(stats.sequences_running(), 0);
}

// A llama2.c tokenizer parses no special tokens: the BOS the Llama 2 template writes first must
// still be the BOS token, not the text of its piece ("\n<s>\n").
TEST(ChatLlama2cE2eTest, TheBosTheTemplateWritesIsTheBosToken) {
  ServerProcess server({"--model", testing::ModelPath(), "--tokenizer", testing::TokenizerPath(),
                        "--threads", "1", "--chat-template", Template("llama2.jinja")});
  ASSERT_TRUE(server.ok()) << server.log();
  const Streamed chat = Chat(server.stub(), GreedyChat({{"user", "Once upon a time"}}, 8));
  ASSERT_TRUE(chat.status.ok()) << chat.status.error_message();
  v1::GenerateRequest req = Greedy("[INST] Once upon a time [/INST]", 8);
  req.mutable_sampling()->set_seed(7);
  const Streamed gen = Generate(server.stub(), req);  // BOS added to the text
  ASSERT_TRUE(gen.status.ok()) << gen.status.error_message();
  EXPECT_EQ(chat.last.usage().prompt_tokens(), gen.last.usage().prompt_tokens());
  EXPECT_EQ(chat.ids, gen.ids);
  EXPECT_EQ(chat.text, gen.text);
}

}  // namespace
}  // namespace heavykv
