// GgufFile (engine/gguf/gguf.h) and GgufWriter: the llama.cpp-made fixtures open with the right
// metadata, shapes and byte sizes; the writer round-trips every value type; broken and hostile
// files (truncated, huge counts and lengths, bad shapes, types, offsets, alignment, duplicates)
// give INVALID_ARGUMENT naming what is wrong, never a crash; random byte flips give OK or an error.
#include "engine/gguf/gguf.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/gguf/gguf_writer.h"
#include "engine/model/gguf_support.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace heavykv {
namespace {

using ::heavykv::testing::SourcePath;
using ::heavykv::testing::TempDir;

std::string RepoFixture(const std::string& name) { return SourcePath("tests/data/gguf/" + name); }
std::string SharedDir() { return SourcePath("../shared/gguf"); }

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
}

// Raw little-endian bytes, for headers the writer would not produce.
struct Bytes {
  std::string s;
  Bytes& U32(uint32_t v) { return Raw(&v, 4); }
  Bytes& U64(uint64_t v) { return Raw(&v, 8); }
  Bytes& Str(const std::string& v) {
    U64(v.size());
    s += v;
    return *this;
  }
  Bytes& Raw(const void* p, size_t n) {
    s.append(static_cast<const char*>(p), n);
    return *this;
  }
  Bytes& Header(uint64_t tensors, uint64_t kvs, uint32_t version = 3) {
    s += "GGUF";
    return U32(version).U64(tensors).U64(kvs);
  }
  Bytes& KvU32(const std::string& key, uint32_t v) { return Str(key).U32(4).U32(v); }
  Bytes& Tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type,
                uint64_t offset) {
    Str(name).U32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) U64(d);
    return U32(type).U64(offset);
  }
  Bytes& PadTo(size_t a) {
    s.append((a - s.size() % a) % a, '\0');
    return *this;
  }
  Bytes& Zeros(size_t n) {
    s.append(n, '\0');
    return *this;
  }
};

std::string F32Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// A small valid file with every value type and three tensors; the last tensor's bytes end the
// file exactly (no trailing padding), so every strict prefix is truncated somewhere that matters.
std::string SmallFile() {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddU8("t.u8", 200);
  w.AddI8("t.i8", -5);
  w.AddU16("t.u16", 60000);
  w.AddI16("t.i16", -30000);
  w.AddU32("llama.context_length", 512);
  w.AddI32("t.i32", -7);
  w.AddU64("t.u64", uint64_t{1} << 40);
  w.AddI64("t.i64", -(int64_t{1} << 40));
  w.AddF32("t.f32", 1.5f);
  w.AddF64("t.f64", 0.25);
  w.AddBool("t.bool", true);
  w.AddArrayI32("t.ai32", {1, -2, 3});
  w.AddArrayF32("t.af32", {0.5f, -1.0f});
  w.AddArrayString("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "", "h\xc3\xa9llo"});
  EXPECT_TRUE(w.AddTensor("a", GgmlType::kF32, {3}, F32Bytes({1, 2, 3})).ok());
  EXPECT_TRUE(w.AddTensor("q", GgmlType::kQ8_0, {32, 2}, std::string(68, '\x01')).ok());
  EXPECT_TRUE(w.AddTensor("b", GgmlType::kF16, {16}, std::string(32, '\x02')).ok());
  return w.Serialize();
}

// Opens `bytes` as a file; the status must be INVALID_ARGUMENT, name the file and contain each
// of `parts`.
void ExpectRejected(const std::string& bytes, const std::vector<std::string>& parts) {
  TempDir dir;
  const std::string path = dir.File("broken.gguf");
  WriteAll(path, bytes);
  absl::StatusOr<GgufFile> f = GgufFile::Open(path);
  ASSERT_FALSE(f.ok()) << "accepted a broken file, want an error containing " << parts[0];
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
  const std::string msg(f.status().message());
  EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
}

// Every tensor lies in the data section, and they tile it in file order with alignment padding
// only: this pins each type's byte size to what llama.cpp wrote.
void ExpectTensorsTileDataSection(const GgufFile& f) {
  std::vector<const GgufTensor*> ts;
  for (const GgufTensor& t : f.tensors()) ts.push_back(&t);
  std::sort(ts.begin(), ts.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  uint64_t end = 0;
  for (const GgufTensor* t : ts) {
    EXPECT_EQ(t->offset, (end + f.alignment() - 1) / f.alignment() * f.alignment()) << t->name;
    end = t->offset + t->data.size();
  }
  if (!ts.empty()) {
    EXPECT_LT(f.file_size() - (f.data_offset() + end), f.alignment()) << f.path();
  }
}

TEST(GgufTest, EverySharedFixtureOpensAndTilesItsDataSection) {
  if (!std::filesystem::exists(SharedDir())) GTEST_SKIP() << SharedDir() << " is not here";
  int opened = 0;
  for (const auto& e : std::filesystem::directory_iterator(SharedDir())) {
    if (e.path().extension() != ".gguf") continue;
    absl::StatusOr<GgufFile> f = GgufFile::Open(e.path().string());
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_TRUE(f->GetString("general.architecture").ok()) << e.path();
    ExpectTensorsTileDataSection(*f);
    ++opened;
  }
  EXPECT_EQ(opened, 21);  // ../shared/gguf/README.md: 15 models, 6 vocabularies
}

TEST(GgufTest, Stories260KF32MatchesTheCheckpointItCameFrom) {
  absl::StatusOr<GgufFile> f = GgufFile::Open(RepoFixture("s260-f32.gguf"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(*f->GetString("general.architecture"), "llama");
  EXPECT_EQ(*f->GetU32("llama.context_length"), 512u);
  EXPECT_EQ(*f->GetI64("llama.embedding_length"), 64);
  EXPECT_EQ(*f->GetI32("llama.block_count"), 5);
  EXPECT_EQ(*f->GetU32("llama.attention.head_count"), 8u);
  EXPECT_EQ(*f->GetU32("llama.attention.head_count_kv"), 4u);
  EXPECT_EQ(*f->GetU32("llama.feed_forward_length"), 172u);
  EXPECT_FLOAT_EQ(*f->GetF32("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
  absl::StatusOr<std::vector<absl::string_view>> tokens =
      f->GetArrayString("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ(tokens->size(), 512u);
  EXPECT_EQ((*tokens)[1], "<s>");
  EXPECT_EQ((*tokens)[3], "<0x00>");
  EXPECT_EQ(f->GetArrayF32("tokenizer.ggml.scores")->size(), 512u);
  EXPECT_EQ(f->GetArrayI64("tokenizer.ggml.token_type")->at(0), 2);

  ASSERT_EQ(f->tensors().size(), 48u);  // 3 + 5 layers x 9
  const GgufTensor* emb = f->FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->type, GgmlType::kF32);
  EXPECT_EQ(emb->num_dims, 2);
  EXPECT_EQ(emb->dims[0], 64);
  EXPECT_EQ(emb->dims[1], 512);
  EXPECT_EQ(emb->num_elements, 64 * 512);
  ASSERT_EQ(emb->data.size(), 64u * 512 * 4);
  // The same fp32 embedding table as the llama2.c checkpoint's, which follows its 28-byte header.
  const std::string ckpt = ReadAll(testing::ModelPath());
  ASSERT_GE(ckpt.size(), 28u + emb->data.size());
  EXPECT_EQ(std::memcmp(ckpt.data() + 28, emb->data.data(), emb->data.size()), 0);
  const GgufTensor* wk = f->FindTensor("blk.4.attn_k.weight");
  ASSERT_NE(wk, nullptr);
  EXPECT_EQ(wk->dims[0], 64);
  EXPECT_EQ(wk->dims[1], 32);  // kv heads x head dim
  EXPECT_EQ(f->FindTensor("blk.5.attn_k.weight"), nullptr);
  ExpectTensorsTileDataSection(*f);
  EXPECT_TRUE(CheckGgufSupported(*f).ok()) << CheckGgufSupported(*f);
}

TEST(GgufTest, QuantizedFixturesHaveTheirTypesAndSizes) {
  absl::StatusOr<GgufFile> q = GgufFile::Open(RepoFixture("s260-q4_k_m.gguf"));
  ASSERT_TRUE(q.ok()) << q.status();
  const GgufTensor* emb = q->FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->type, GgmlType::kQ5_0);
  EXPECT_EQ(emb->data.size(), 64u / 32 * 22 * 512);
  EXPECT_EQ(q->FindTensor("output.weight")->type, GgmlType::kQ8_0);
  EXPECT_EQ(q->FindTensor("blk.0.ffn_down.weight")->type, GgmlType::kF16);
  EXPECT_EQ(q->FindTensor("blk.0.ffn_down.weight")->data.size(), 172u * 64 * 2);
  EXPECT_EQ(*q->GetU32("general.file_type"), 15u);  // LLAMA_FTYPE_MOSTLY_Q4_K_M

  absl::StatusOr<GgufFile> r = GgufFile::Open(RepoFixture("rl256-q4_0.gguf"));
  ASSERT_TRUE(r.ok()) << r.status();
  const GgufTensor* down = r->FindTensor("blk.1.ffn_down.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->type, GgmlType::kQ4_0);
  EXPECT_EQ(down->dims[0], 768);
  EXPECT_EQ(down->dims[1], 256);
  EXPECT_EQ(down->data.size(), 768u / 32 * 18 * 256);
  const GgufTensor* out = r->FindTensor("output.weight");
  EXPECT_EQ(out->type, GgmlType::kQ6_K);
  EXPECT_EQ(out->data.size(), 256u / 256 * 210 * 512);
  EXPECT_FLOAT_EQ(*r->GetF32("llama.rope.freq_base"), 10000.0f);
  ExpectTensorsTileDataSection(*r);
}

TEST(GgufTest, Llama3VocabFromSharedFixtures) {
  const std::string path = SharedDir() + "/llama3-vocab.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is not here";
  absl::StatusOr<GgufFile> f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  absl::StatusOr<std::vector<absl::string_view>> tokens =
      f->GetArrayString("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(tokens->size(), 128256u);
  EXPECT_EQ((*tokens)[0], "!");
  EXPECT_EQ(*f->GetU32("tokenizer.ggml.bos_token_id"), 128000u);
  EXPECT_TRUE(*f->GetBool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(*f->GetString("tokenizer.ggml.pre"), "llama-bpe");
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_EQ(CheckGgufSupported(*f).code(), absl::StatusCode::kInvalidArgument);
}

TEST(GgufTest, IsGgufFileTellsGgufFromLlama2cByMagic) {
  EXPECT_TRUE(IsGgufFile(RepoFixture("s260-f32.gguf")));
  EXPECT_FALSE(IsGgufFile(testing::ModelPath()));
  EXPECT_FALSE(IsGgufFile(RepoFixture("no-such-file.gguf")));
}

TEST(GgufTest, MissingFileIsNotFound) {
  absl::StatusOr<GgufFile> f = GgufFile::Open(RepoFixture("no-such-file.gguf"));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
}

TEST(GgufTest, WriterRoundTripsEveryValueType) {
  TempDir dir;
  WriteAll(dir.File("m.gguf"), SmallFile());
  absl::StatusOr<GgufFile> f = GgufFile::Open(dir.File("m.gguf"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*f->GetU32("t.u8"), 200u);
  EXPECT_EQ(*f->GetI32("t.i8"), -5);
  EXPECT_EQ(*f->GetU32("t.u16"), 60000u);
  EXPECT_EQ(*f->GetI64("t.i16"), -30000);
  EXPECT_EQ(*f->GetU64("llama.context_length"), 512u);
  EXPECT_EQ(*f->GetI64("t.i32"), -7);
  EXPECT_EQ(*f->GetU64("t.u64"), uint64_t{1} << 40);
  EXPECT_EQ(*f->GetI64("t.i64"), -(int64_t{1} << 40));
  EXPECT_EQ(*f->GetF32("t.f32"), 1.5f);
  EXPECT_EQ(*f->GetF64("t.f32"), 1.5);
  EXPECT_EQ(*f->GetF64("t.f64"), 0.25);
  EXPECT_TRUE(*f->GetBool("t.bool"));
  EXPECT_EQ(*f->GetArrayI64("t.ai32"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(*f->GetArrayF32("t.af32"), (std::vector<float>{0.5f, -1.0f}));
  std::vector<absl::string_view> tokens = *f->GetArrayString("tokenizer.ggml.tokens");
  EXPECT_EQ(tokens, (std::vector<absl::string_view>{"<unk>", "<s>", "</s>", "", "h\xc3\xa9llo"}));
  const GgufMetadata* m = f->FindMetadata("tokenizer.ggml.tokens");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->element_type, GgufValueType::kString);
  EXPECT_EQ(m->count, 5u);
  EXPECT_EQ(std::get<absl::string_view>(m->Element(4)), "h\xc3\xa9llo");
  // File order, with types.
  ASSERT_EQ(f->metadata().size(), 15u);
  EXPECT_EQ(f->metadata()[1].key, "t.u8");
  EXPECT_EQ(f->metadata()[1].type, GgufValueType::kU8);
  EXPECT_EQ(f->metadata()[12].type, GgufValueType::kArray);

  ASSERT_EQ(f->tensors().size(), 3u);
  EXPECT_EQ(f->tensors()[1].name, "q");
  EXPECT_EQ(f->tensors()[1].data.size(), 68u);
  EXPECT_EQ(f->tensors()[1].offset % 32, 0u);
  const GgufTensor* a = f->FindTensor("a");
  ASSERT_NE(a, nullptr);
  float values[3];
  std::memcpy(values, a->data.data(), sizeof(values));
  EXPECT_EQ(values[2], 3.0f);
  ExpectTensorsTileDataSection(*f);
}

TEST(GgufTest, TypedGettersSayWhatIsWrong) {
  TempDir dir;
  WriteAll(dir.File("m.gguf"), SmallFile());
  absl::StatusOr<GgufFile> f = GgufFile::Open(dir.File("m.gguf"));
  ASSERT_TRUE(f.ok()) << f.status();
  auto msg = [](const absl::Status& s) { return std::string(s.message()); };
  EXPECT_NE(msg(f->GetU32("nope").status()).find("metadata key 'nope' is missing"),
            std::string::npos);
  EXPECT_NE(msg(f->GetU32("t.i8").status()).find("value -5 does not fit a u32"), std::string::npos);
  EXPECT_NE(msg(f->GetU32("t.u64").status()).find("does not fit a u32"), std::string::npos);
  EXPECT_NE(msg(f->GetF32("t.u8").status()).find("'t.u8' is a u8, not a f32"), std::string::npos);
  EXPECT_NE(msg(f->GetU32("t.f32").status()).find("is a f32, not a u32"), std::string::npos);
  EXPECT_NE(msg(f->GetString("t.ai32").status()).find("is a array of i32, not a string"),
            std::string::npos);
  EXPECT_FALSE(f->GetArrayF32("t.ai32").ok());
  EXPECT_FALSE(f->GetArrayString("t.af32").ok());
  EXPECT_FALSE(f->GetBool("t.u8").ok());
  EXPECT_EQ(f->GetI64("nope").status().code(), absl::StatusCode::kInvalidArgument);
}

// A streamed file (AddTensorInfo, StartFile, Write in pieces) is the file AddTensor makes; the
// stream refuses bytes past a tensor's end and an early Finish; AddMetadata copies an entry.
TEST(GgufTest, WriterStreamsTensorsInPieces) {
  TempDir dir;
  WriteAll(dir.File("src.gguf"), SmallFile());
  absl::StatusOr<GgufFile> src = GgufFile::Open(dir.File("src.gguf"));
  ASSERT_TRUE(src.ok()) << src.status();
  const std::string x = F32Bytes({1, 2, 3, 4, 5}), z = F32Bytes({6, 7});
  GgufWriter whole(64), streamed(64);
  for (GgufWriter* w : {&whole, &streamed}) {
    for (const GgufMetadata& m : src->metadata()) w->AddMetadata(m);
  }
  ASSERT_TRUE(whole.AddTensor("x", GgmlType::kF32, {5}, x).ok());
  ASSERT_TRUE(whole.AddTensor("y", GgmlType::kI8, {3}, "abc").ok());
  ASSERT_TRUE(whole.AddTensor("z", GgmlType::kF32, {2}, z).ok());
  ASSERT_TRUE(streamed.AddTensorInfo("x", GgmlType::kF32, {5}).ok());
  ASSERT_TRUE(streamed.AddTensor("y", GgmlType::kI8, {3}, "abc").ok());  // written by the stream
  ASSERT_TRUE(streamed.AddTensorInfo("z", GgmlType::kF32, {2}).ok());
  EXPECT_FALSE(streamed.AddTensorInfo("q", GgmlType::kQ4_K, {100}).ok());
  absl::StatusOr<GgufStreamWriter> out = streamed.StartFile(dir.File("s.gguf"));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out->current_tensor(), "x");
  ASSERT_TRUE(out->Write(x.data(), 7).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(out->Write(x.data(), 14)));  // past x's 20 bytes
  ASSERT_TRUE(out->Write(x.data() + 7, 13).ok());
  EXPECT_EQ(*out->current_tensor(), "z");
  EXPECT_TRUE(absl::IsFailedPrecondition(out->Finish()));
  ASSERT_TRUE(out->Write(z.data(), z.size()).ok());
  EXPECT_EQ(out->current_tensor(), nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(out->Write(z.data(), 1)));
  ASSERT_TRUE(out->Finish().ok());
  EXPECT_EQ(ReadAll(dir.File("s.gguf")), whole.Serialize());
  EXPECT_EQ(streamed.Serialize().size(), whole.Serialize().size());  // zeros for x and z
  absl::StatusOr<GgufFile> f = GgufFile::Open(dir.File("s.gguf"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->metadata().size(), src->metadata().size() + 1);  // + general.alignment
  // WriteFile needs every tensor's bytes.
  EXPECT_TRUE(absl::IsFailedPrecondition(streamed.WriteFile(dir.File("t.gguf"))));
}

TEST(GgufTest, WriterAlignsToItsAlignmentAndMovesKeepViews) {
  GgufWriter w(64);
  w.AddString("general.architecture", "llama");
  ASSERT_TRUE(w.AddTensor("x", GgmlType::kF32, {5}, F32Bytes({1, 2, 3, 4, 5})).ok());
  ASSERT_TRUE(w.AddTensor("y", GgmlType::kI8, {3}, "abc").ok());
  EXPECT_FALSE(w.AddTensor("z", GgmlType::kQ4_0, {33}, std::string(18, '\0')).ok());
  EXPECT_FALSE(w.AddTensor("z", GgmlType::kF32, {2}, std::string(7, '\0')).ok());
  TempDir dir;
  ASSERT_TRUE(w.WriteFile(dir.File("a.gguf")).ok());
  EXPECT_EQ(ReadAll(dir.File("a.gguf")), w.Serialize());
  absl::StatusOr<GgufFile> f = GgufFile::Open(dir.File("a.gguf"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset() % 64, 0u);
  EXPECT_EQ(f->FindTensor("y")->offset, 64u);
  GgufFile moved = *std::move(f);
  const GgufTensor* y = moved.FindTensor("y");
  ASSERT_NE(y, nullptr);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(y->data.data()), y->data.size()), "abc");
  EXPECT_EQ(*moved.GetString("general.architecture"), "llama");
}

TEST(GgufTest, EveryTruncationIsAnError) {
  const std::string file = SmallFile();
  TempDir dir;
  const std::string path = dir.File("t.gguf");
  for (size_t n = 0; n < file.size(); ++n) {
    WriteAll(path, file.substr(0, n));
    absl::StatusOr<GgufFile> f = GgufFile::Open(path);
    ASSERT_FALSE(f.ok()) << "prefix of " << n << " bytes was accepted";
    ASSERT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
  }
  WriteAll(path, file);
  EXPECT_TRUE(GgufFile::Open(path).ok());
}

TEST(GgufTest, BrokenHeaders) {
  ExpectRejected(Bytes().Raw("GGML", 4).U32(3).U64(0).U64(0).s, {"not a GGUF file"});
  ExpectRejected(Bytes().Header(0, 0, 1).s, {"version 1 is not supported"});
  ExpectRejected(Bytes().Header(0, 0, 4).s, {"version 4 is not supported"});
  ExpectRejected(Bytes().Header(0, 0, 0x03000000).s, {"big-endian"});
  ExpectRejected(Bytes().Header(uint64_t{1} << 40, 0).Zeros(64).s,
                 {"tensor count 1099511627776 cannot fit"});
  ExpectRejected(Bytes().Header(0, ~uint64_t{0}).Zeros(64).s, {"metadata count"});
  ExpectRejected("GGUF", {"fewer than a GGUF header"});
}

TEST(GgufTest, HostileMetadata) {
  // A key length far past the file.
  ExpectRejected(Bytes().Header(0, 1).U64(uint64_t{1} << 62).Zeros(16).s,
                 {"metadata #0", "key length 4611686018427387904", "longer than"});
  // A string value's length past the file.
  ExpectRejected(Bytes().Header(0, 1).Str("k").U32(8).U64(~uint64_t{0}).s,
                 {"metadata key 'k'", "string length"});
  // Array counts: fixed-size elements and strings.
  ExpectRejected(Bytes().Header(0, 1).Str("k").U32(9).U32(4).U64(uint64_t{1} << 62).Zeros(8).s,
                 {"metadata key 'k'", "array of 4611686018427387904 u32 cannot fit"});
  ExpectRejected(Bytes().Header(0, 1).Str("k").U32(9).U32(11).U64(~uint64_t{0}).Zeros(8).s,
                 {"array of 18446744073709551615 i64 cannot fit"});
  ExpectRejected(Bytes().Header(0, 1).Str("k").U32(9).U32(8).U64(uint64_t{1} << 60).Zeros(8).s,
                 {"strings cannot fit"});
  // A string inside an array that runs past the end.
  ExpectRejected(Bytes().Header(0, 1).Str("k").U32(9).U32(8).U64(2).Str("a").U64(100).s,
                 {"string #1 length 100"});
  ExpectRejected(Bytes().Header(0, 1).Str("k").U32(13).U32(0).s,
                 {"value type 13 is not a GGUF value type"});
  ExpectRejected(Bytes().Header(0, 1).Str("k").U32(9).U32(9).U32(4).U64(0).s,
                 {"arrays of arrays are not supported"});
  ExpectRejected(Bytes().Header(0, 1).Str("k").U32(7).Raw("\x02", 1).Zeros(8).s,
                 {"bool value 2 is not 0 or 1"});
  ExpectRejected(Bytes().Header(0, 2).KvU32("k", 1).KvU32("k", 2).s,
                 {"metadata key 'k'", "appears twice"});
}

TEST(GgufTest, BadAlignment) {
  for (uint32_t a : {0u, 3u, 48u}) {
    ExpectRejected(Bytes().Header(0, 1).KvU32("general.alignment", a).s,
                   {"general.alignment", "is not a power of two"});
  }
  ExpectRejected(Bytes().Header(0, 1).Str("general.alignment").U32(8).Str("32").s,
                 {"'general.alignment' is a string, not a u64"});
  // A power of two so large that the data section would start past the end of the file.
  Bytes b;
  b.Header(1, 1).Str("general.alignment").U32(10).U64(uint64_t{1} << 62);
  b.Tensor("t", {1}, 0, 0).Zeros(4);
  ExpectRejected(b.s, {"data section", "past the end of the file"});
}

// One tensor info `t` after a header, then the data section with `data_bytes` bytes.
std::string OneTensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type,
                      uint64_t offset, size_t data_bytes = 64) {
  return Bytes()
      .Header(1, 0)
      .Tensor(name, std::move(dims), type, offset)
      .PadTo(32)
      .Zeros(data_bytes)
      .s;
}

TEST(GgufTest, HostileTensorInfos) {
  EXPECT_TRUE([] {
    TempDir dir;
    WriteAll(dir.File("ok.gguf"), OneTensor("w", {16}, 0, 0));
    return GgufFile::Open(dir.File("ok.gguf")).ok();
  }());
  ExpectRejected(OneTensor("w", {1, 1, 1, 1, 1}, 0, 0), {"tensor 'w'", "n_dims 5 is not in 1..4"});
  ExpectRejected(OneTensor("w", {}, 0, 0), {"tensor 'w'", "n_dims 0"});
  ExpectRejected(OneTensor("w", {uint64_t{1} << 32, uint64_t{1} << 32}, 0, 0),
                 {"tensor 'w'", "overflows int64"});
  ExpectRejected(OneTensor("w", {uint64_t{1} << 62, 4}, 0, 0), {"tensor 'w'", "overflows"});
  ExpectRejected(OneTensor("w", {~uint64_t{0}}, 0, 0), {"dimension 0 is 18446744073709551615"});
  ExpectRejected(OneTensor("w", {4, 0}, 0, 0), {"dimension 1 is 0"});
  ExpectRejected(OneTensor("blk.0.attn_q.weight", {32}, 16, 0),
                 {"tensor 'blk.0.attn_q.weight'", "unknown ggml type id 16"});
  ExpectRejected(OneTensor("w", {33}, 2, 0), {"row length 33 is not a multiple of Q4_0"});
  ExpectRejected(OneTensor("blk.0.attn_q.weight", {16}, 0, 1024),
                 {"tensor 'blk.0.attn_q.weight'", "ends past the end of the file (size"});
  ExpectRejected(OneTensor("w", {32}, 0, 0), {"tensor 'w': data [", "ends past the end"});
  ExpectRejected(
      OneTensor("w", {1}, 0, ~uint64_t{0} - 31),
      {"data [18446744073709551648, 18446744073709551652) ends past the end"});  // no wrap-around
  ExpectRejected(OneTensor("w", {4}, 0, 8), {"offset 8 is not a multiple of the alignment 32"});
  ExpectRejected(Bytes().Header(1, 0).U64(uint64_t{1} << 62).Zeros(32).s,
                 {"tensor #0", "name length 4611686018427387904"});
}

TEST(GgufTest, DuplicateAndOverlappingTensors) {
  ExpectRejected(
      Bytes().Header(2, 0).Tensor("w", {4}, 0, 0).Tensor("w", {4}, 0, 32).PadTo(32).Zeros(64).s,
      {"tensor 'w'", "appears twice"});
  ExpectRejected(
      Bytes().Header(2, 0).Tensor("a", {16}, 0, 0).Tensor("b", {4}, 0, 32).PadTo(32).Zeros(128).s,
      {"tensor 'b'", "overlaps tensor 'a'"});
}

// Random byte flips in the header of valid files: Open returns OK or INVALID_ARGUMENT, never
// anything else, and whatever it accepts keeps its promises.
TEST(GgufTest, MutatedFilesGiveOkOrAnError) {
  std::vector<std::string> bases = {SmallFile(), ReadAll(RepoFixture("s260-q4_k_m.gguf"))};
  std::mt19937_64 rng(14);
  TempDir dir;
  const std::string path = dir.File("m.gguf");
  int ok = 0, rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const std::string& base = bases[iter % 10 == 0 ? 1 : 0];
    std::string bytes = base;
    // Flip bytes in the header (the reader never reads the tensor data), sometimes truncate.
    const size_t header = base.size() == bases[0].size() ? base.size() : 14240;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      const size_t at = rng() % header;
      bytes[at] = static_cast<char>(rng() % 3 == 0 ? 0xff : bytes[at] ^ (1 << (rng() % 8)));
    }
    if (rng() % 10 == 0) bytes.resize(rng() % bytes.size());
    WriteAll(path, bytes);
    absl::StatusOr<GgufFile> f = GgufFile::Open(path);
    if (!f.ok()) {
      ASSERT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
      ++rejected;
      continue;
    }
    ++ok;
    const auto* begin = reinterpret_cast<const uint8_t*>(
                            f->tensors().empty() ? nullptr : f->tensors()[0].data.data()) -
                        (f->tensors().empty() ? 0 : f->data_offset() + f->tensors()[0].offset);
    for (const GgufTensor& t : f->tensors()) {
      ASSERT_GE(t.data.data(), begin + f->data_offset());
      ASSERT_LE(t.data.data() + t.data.size(), begin + f->file_size());
    }
    for (const GgufMetadata& m : f->metadata()) {
      if (m.is_array() && m.count > 0) (void)m.Element(m.count - 1);
    }
  }
  EXPECT_GT(ok, 100);
  EXPECT_GT(rejected, 100);
}

// `heavykv ARGS`: its exit code, stdout and stderr.
struct Cli {
  int code = -1;
  std::string out, err;
};
Cli Heavykv(const std::string& args) {
  TempDir dir;
  const std::string err_path = dir.File("stderr");
  const std::string cmd = std::string(HEAVYKV_BINARY) + " " + args + " 2>" + err_path;
  Cli r;
  std::FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = ReadAll(err_path);
  return r;
}

TEST(InspectCliTest, TextOnAGgufFixture) {
  Cli r = Heavykv("inspect " + RepoFixture("s260-q4_k_m.gguf"));
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* line : {
           "format: GGUF v3, 304096 bytes, alignment 32, data section at 14240\n",
           "architecture: llama\n",
           "metadata: 21 keys\n",
           "tensors: 48\n",
           "total: 292800 parameters, 289696 bytes of tensor data\n",
           "supported: yes\n",
       }) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  }
  // One line per key and per tensor; long arrays summarized with their count.
  EXPECT_NE(r.out.find("  llama.context_length                     u32            512\n"),
            std::string::npos);
  EXPECT_NE(r.out.find("  tokenizer.ggml.tokens                    array[string]  512 [\"<unk>\", "
                       "\"<s>\", \"</s>\", \"<0x00>\", \"<0x01>\", \"<0x02>\", \"<0x03>\", "
                       "\"<0x04>\", ...]\n"),
            std::string::npos);
  EXPECT_NE(r.out.find("  token_embd.weight                        Q5_0  [64, 512]              "
                       "22528 bytes\n"),
            std::string::npos)
      << r.out;
}

TEST(InspectCliTest, JsonOnAGgufFixture) {
  Cli r = Heavykv("inspect --json " + RepoFixture("rl256-q4_0.gguf"));
  ASSERT_EQ(r.code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["format"], "gguf");
  EXPECT_EQ(j["version"], 3);
  EXPECT_EQ(j["architecture"], "llama");
  EXPECT_EQ(j["metadata"].size(), 22u);
  EXPECT_EQ(j["tensors"].size(), 21u);
  EXPECT_EQ(j["total_parameters"], 1770752);
  EXPECT_EQ(j["total_bytes"], 1034240);
  EXPECT_EQ(j["supported"], true);
  for (const auto& m : j["metadata"]) {
    if (m["key"] == "tokenizer.ggml.scores") {
      EXPECT_EQ(m["type"], "array");
      EXPECT_EQ(m["element_type"], "f32");
      EXPECT_EQ(m["count"], 512);
      EXPECT_EQ(m["first"].size(), 8u);
    }
    if (m["key"] == "llama.rope.freq_base") {
      EXPECT_EQ(m["value"], 10000.0);
    }
  }
  const auto& down = j["tensors"][8];
  EXPECT_EQ(down["name"], "blk.0.ffn_down.weight");
  EXPECT_EQ(down["type"], "Q4_0");
  EXPECT_EQ(down["shape"], (nlohmann::json{768, 256}));
  EXPECT_EQ(down["bytes"], 110592);
}

TEST(InspectCliTest, JsonCutsLongStrings) {
  const std::string path = SharedDir() + "/llama3-vocab.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is not here";
  Cli r = Heavykv("inspect --json " + path);
  ASSERT_EQ(r.code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  for (const auto& m : j["metadata"]) {
    if (m["key"] == "tokenizer.chat_template") {
      EXPECT_EQ(m["bytes"], 348);
      EXPECT_EQ(m["value"].get<std::string>().size(), 80u);
    }
  }
  EXPECT_EQ(j["reason"], "the file has no tensors (a vocabulary-only file?)");
}

TEST(InspectCliTest, Llama2cCheckpoint) {
  Cli r = Heavykv("inspect " + testing::ModelPath());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("format: llama2.c checkpoint"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  n_kv_heads         4\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("supported: yes\n"), std::string::npos) << r.out;
  r = Heavykv("inspect --json " + testing::ModelPath());
  ASSERT_EQ(r.code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["format"], "llama2.c");
  EXPECT_EQ(j["dim"], 64);
  EXPECT_EQ(j["n_layers"], 5);
  EXPECT_EQ(j["vocab_size"], 512);
  EXPECT_EQ(j["seq_len"], 512);
}

TEST(InspectCliTest, BrokenFilesAreClearErrors) {
  TempDir dir;
  std::string bytes = ReadAll(RepoFixture("s260-q4_k_m.gguf"));
  bytes.resize(14000);  // inside the tensor infos
  WriteAll(dir.File("cut.gguf"), bytes);
  Cli r = Heavykv("inspect " + dir.File("cut.gguf"));
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("error: " + dir.File("cut.gguf") + ": tensor #44: name length"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("truncated"), std::string::npos) << r.err;

  WriteAll(dir.File("junk.bin"), "hello");
  r = Heavykv("inspect --json " + dir.File("junk.bin"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("not a GGUF file"), std::string::npos) << r.err;

  r = Heavykv("inspect " + dir.File("missing.gguf"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("no such file"), std::string::npos) << r.err;
  EXPECT_EQ(Heavykv("inspect").code, 2);
}

}  // namespace
}  // namespace heavykv
