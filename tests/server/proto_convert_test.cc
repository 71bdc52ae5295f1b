// The gRPC conversions of prompt logprobs (issue 44): GenerateRequest and ChatRequest's
// prompt_logprobs reach GenerationRequest (unset: -1), and a delta's PromptLogprobs becomes
// GenerateResponse.prompt_logprobs (the first logprob NaN, one TopLogprobs per prompt token).
#include "server/grpc/proto_convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace heavykv::server {
namespace {

TEST(ProtoConvertTest, PromptLogprobsReachTheRequest) {
  v1::GenerateRequest q;
  q.set_prompt("Once");
  absl::StatusOr<GenerationRequest> r = FromProto(q);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->prompt_logprobs, -1);
  q.set_prompt_logprobs(0);
  q.set_max_new_tokens(0);
  r = FromProto(q);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->prompt_logprobs, 0);
  EXPECT_EQ(r->max_new_tokens, 0);
  v1::ChatRequest c;
  c.add_messages()->set_content("hi");
  c.set_prompt_logprobs(3);
  r = FromProto(c);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->prompt_logprobs, 3);
}

TEST(ProtoConvertTest, PromptLogprobsGoOnTheResponse) {
  auto p = std::make_shared<PromptLogprobs>();
  p->token_ids = {1, 7, 9};
  p->token_bytes = {"", "a", "b"};
  p->logprobs = {std::numeric_limits<float>::quiet_NaN(), -1.5f, -0.25f};
  p->ranks = {0, 2, 1};
  p->top = {{}, {{4, -0.5f, "x"}, {7, -1.5f, "a"}}, {{9, -0.25f, "b"}, {3, -2.0f, "y"}}};
  GenerationDelta d;
  d.prompt = p;
  d.finished = true;
  d.finish_reason = "length";
  v1::GenerateResponse out;
  AppendDelta(d, &out);
  ASSERT_TRUE(out.has_prompt_logprobs());
  const v1::PromptLogprobs& got = out.prompt_logprobs();
  ASSERT_EQ(got.token_ids_size(), 3);
  EXPECT_EQ(got.token_ids(1), 7);
  ASSERT_EQ(got.logprobs_size(), 3);
  EXPECT_TRUE(std::isnan(got.logprobs(0)));
  EXPECT_FLOAT_EQ(got.logprobs(2), -0.25f);
  ASSERT_EQ(got.ranks_size(), 3);
  EXPECT_EQ(got.ranks(1), 2);
  ASSERT_EQ(got.top_size(), 3);
  EXPECT_EQ(got.top(0).token_ids_size(), 0);
  EXPECT_EQ(got.top(1).token_ids(0), 4);
  EXPECT_FLOAT_EQ(got.top(2).logprobs(1), -2.0f);
  EXPECT_EQ(out.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(out.token_ids_size(), 0);
  // A later delta of the same call adds no second copy.
  GenerationDelta next;
  AppendDelta(next, &out);
  EXPECT_EQ(out.prompt_logprobs().token_ids_size(), 3);
}

}  // namespace
}  // namespace heavykv::server
