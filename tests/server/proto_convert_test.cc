// FromProto: the heavykv.v1 request messages -> GenerationRequest.
#include "server/grpc/proto_convert.h"

#include <utility>
#include <vector>

#include "gtest/gtest.h"

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

}  // namespace
}  // namespace heavykv::server
