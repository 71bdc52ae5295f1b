// Fuzzes RequestValidator::Resolve (engine/serving/request_validation.h) against the bundled
// model's configuration and tokenizer: every GenerationRequest field is drawn from the input, the
// prompt as text, token ids or a chat. Resolve must
// return a status for anything, and an accepted request must keep the validator's promises
// (fuzz_util.h CheckResolved).
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>

#include "engine/serving/request_validation.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

template <typename T>
std::optional<T> MaybeInt(FuzzedDataProvider& in) {
  if (!in.ConsumeBool()) return std::nullopt;
  return in.ConsumeIntegral<T>();
}

template <typename T>
std::optional<T> MaybeFloat(FuzzedDataProvider& in) {
  if (!in.ConsumeBool()) return std::nullopt;
  // Mostly plausible values in [0, 2], sometimes any bit pattern (NaN, inf, negatives, huge).
  if (in.ConsumeBool()) return in.ConsumeFloatingPointInRange<T>(0, 2);
  return in.ConsumeFloatingPoint<T>();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const heavykv::fuzz::BundledServer* server = new heavykv::fuzz::BundledServer();
  FuzzedDataProvider in(data, size);
  heavykv::GenerationRequest q;
  q.request_id = in.ConsumeRandomLengthString(64);
  const int input = in.ConsumeIntegralInRange(0, 2);
  if (input == 0) {
    q.prompt = in.ConsumeRandomLengthString(512);
  } else if (input == 2) {
    // A chat, rendered with BundledServer's ChatML template.
    std::vector<heavykv::ChatMessage>& messages = q.messages.emplace();
    for (int n = in.ConsumeIntegralInRange(0, 6); n > 0; --n) {
      messages.push_back({in.ConsumeRandomLengthString(12), in.ConsumeRandomLengthString(128)});
    }
    q.add_generation_prompt = in.ConsumeBool();
  } else {
    const int n = in.ConsumeIntegralInRange(0, 300);
    const int32_t vocab = server->config.vocab_size;
    for (int i = 0; i < n && in.remaining_bytes() > 0; ++i) {
      // Mostly ids near the vocabulary's range, sometimes any int32.
      q.prompt_token_ids.push_back(in.ConsumeBool() ? in.ConsumeIntegralInRange(-2, vocab + 1)
                                                    : in.ConsumeIntegral<int32_t>());
    }
  }
  q.max_new_tokens = in.ConsumeBool() ? in.ConsumeIntegralInRange(-1, 300)
                                      : in.ConsumeIntegral<int32_t>();
  q.temperature = MaybeFloat<float>(in);
  q.top_p = MaybeFloat<float>(in);
  q.top_k = MaybeInt<int32_t>(in);
  q.seed = MaybeInt<uint64_t>(in);
  for (int n = in.ConsumeIntegralInRange(0, 4); n > 0; --n) {
    q.stop.push_back(in.ConsumeRandomLengthString(16));
  }
  for (int n = in.ConsumeIntegralInRange(0, 4); n > 0; --n) {
    q.stop_token_ids.push_back(in.ConsumeIntegral<int32_t>());
  }
  q.ignore_eos = in.ConsumeBool();
  if (in.ConsumeBool()) {
    static constexpr const char* kPolicies[] = {"full", "window", "sink", "h2o", "", "H2O",
                                                "h2o:granularity=page",
                                                "window:granularity=page",
                                                "sink:layers=pyramid", "h2o:layers=squeeze"};
    q.policy = in.ConsumeBool() ? std::string(in.PickValueInArray(kPolicies))
                                : in.ConsumeRandomLengthString(8);
  }
  q.budget_tokens = MaybeInt<int32_t>(in);
  q.budget_fraction = MaybeFloat<double>(in);
  q.recent_fraction = MaybeFloat<double>(in);
  q.logprobs = in.ConsumeBool();
  q.top_logprobs = in.ConsumeIntegralInRange(-2, heavykv::kMaxTopLogprobs + 2);

  absl::StatusOr<heavykv::ResolvedRequest> r = server->validator->Resolve(q);
  if (r.ok()) {
    heavykv::fuzz::CheckResolved(*server, *r);
  } else if (r.status().code() != absl::StatusCode::kInvalidArgument) {
    heavykv::fuzz::Die("Resolve rejected a request with a code other than INVALID_ARGUMENT");
  }
  return 0;
}
