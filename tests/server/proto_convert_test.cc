// The gRPC conversions (server/grpc/proto_convert.h): the sampling API's fields of
// SamplingParams reach GenerationRequest; prompt_logprobs (issue 44) of GenerateRequest and
// ChatRequest too (unset: -1), and a delta's PromptLogprobs becomes
// GenerateResponse.prompt_logprobs (the first logprob NaN, one TopLogprobs per prompt token).
#include "server/grpc/proto_convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

namespace heavykv::server {
namespace {

TEST(ProtoConvertTest, SamplingApiFieldsReachTheRequest) {
  v1::GenerateRequest q;
  q.mutable_prompt_token_ids()->add_ids(5);
  v1::SamplingParams& s = *q.mutable_sampling();
  s.set_min_p(0.05f);
  s.set_presence_penalty(0.5f);
  s.set_frequency_penalty(-0.25f);
  s.set_repetition_penalty(1.3f);
  s.set_penalty_last_n(64);
  (*s.mutable_logit_bias())[42] = -100.0f;
  (*s.mutable_logit_bias())[7] = 2.5f;
  s.set_min_tokens(3);
  absl::StatusOr<GenerationRequest> r = FromProto(q);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->min_p, 0.05f);
  EXPECT_EQ(r->presence_penalty, 0.5f);
  EXPECT_EQ(r->frequency_penalty, -0.25f);
  EXPECT_EQ(r->repetition_penalty, 1.3f);
  EXPECT_EQ(r->penalty_last_n, 64);
  // By id, whatever the map's order.
  EXPECT_EQ(r->logit_bias, (std::vector<std::pair<int32_t, float>>{{7, 2.5f}, {42, -100.0f}}));
  EXPECT_EQ(r->min_tokens, 3);
}

TEST(ProtoConvertTest, UnsetSamplingApiFieldsStayUnset) {
  v1::ChatRequest q;
  q.add_messages()->set_role("user");
  absl::StatusOr<GenerationRequest> r = FromProto(q);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->min_p.has_value());
  EXPECT_FALSE(r->presence_penalty.has_value());
  EXPECT_FALSE(r->frequency_penalty.has_value());
  EXPECT_FALSE(r->repetition_penalty.has_value());
  EXPECT_FALSE(r->penalty_last_n.has_value());
  EXPECT_TRUE(r->logit_bias.empty());
  EXPECT_EQ(r->min_tokens, 0);
}

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
  d.finished = d.choice_finished = true;  // as the engine sends a request's last delta
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
