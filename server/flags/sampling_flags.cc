#include "server/flags/sampling_flags.h"

#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace heavykv::cli {

void SamplingApiFlags::Register(FlagSet& flags) {
  flags.Double("min-p", &min_p, "drop tokens below min_p x the top probability; 0 = off");
  flags.Double("presence-penalty", &presence_penalty,
               "subtracted once from each generated token's logit, in [-2, 2]; 0 = off");
  flags.Double("frequency-penalty", &frequency_penalty,
               "subtracted per occurrence of each generated token, in [-2, 2]; 0 = off");
  flags.Double("repetition-penalty", &repetition_penalty,
               "divides the positive logits (multiplies the negative) of the tokens seen, prompt "
               "included, in (0, 10]; 1 = off");
  flags.Int("penalty-last-n", &penalty_last_n,
            "--repetition-penalty over the last N tokens seen; -1 = all, 0 = none");
  flags.String("logit-bias", &logit_bias,
               "ID=BIAS[,ID=BIAS...]: added to those tokens' logits, BIAS in [-100, 100]");
  flags.Int("min-tokens", &min_tokens, "no end-of-sequence or stop token before this many");
}

absl::Status SamplingApiFlags::Fill(const FlagSet& flags, GenerationRequest& r) const {
  const auto int32 = [](const char* name, int64_t v) -> absl::StatusOr<int32_t> {
    if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " ", v, " is out of range"));
    }
    return int32_t(v);
  };
  if (flags.IsSet("min-p")) r.min_p = float(min_p);
  if (flags.IsSet("presence-penalty")) r.presence_penalty = float(presence_penalty);
  if (flags.IsSet("frequency-penalty")) r.frequency_penalty = float(frequency_penalty);
  if (flags.IsSet("repetition-penalty")) r.repetition_penalty = float(repetition_penalty);
  if (flags.IsSet("penalty-last-n")) {
    absl::StatusOr<int32_t> n = int32("penalty-last-n", penalty_last_n);
    if (!n.ok()) return n.status();
    r.penalty_last_n = *n;
  }
  if (flags.IsSet("min-tokens")) {
    absl::StatusOr<int32_t> n = int32("min-tokens", min_tokens);
    if (!n.ok()) return n.status();
    r.min_tokens = *n;
  }
  if (!logit_bias.empty()) {
    absl::StatusOr<std::vector<std::pair<int32_t, float>>> bias = ParseLogitBias(logit_bias);
    if (!bias.ok()) return bias.status();
    r.logit_bias = *std::move(bias);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<int32_t, float>>> ParseLogitBias(absl::string_view text) {
  std::vector<std::pair<int32_t, float>> out;
  for (absl::string_view entry : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    const std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(entry, '=');
    int32_t id = 0;
    float bias = 0;
    if (!absl::SimpleAtoi(kv.first, &id) || !absl::SimpleAtof(kv.second, &bias)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--logit-bias wants ID=BIAS[,ID=BIAS...] (e.g. 13=-100,42=2.5), got \"", entry, "\""));
    }
    out.emplace_back(id, bias);
  }
  return out;
}

}  // namespace heavykv::cli
