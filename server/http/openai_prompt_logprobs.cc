#include "server/http/openai_prompt_logprobs.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/http/openai_json.h"

namespace heavykv::server {

nlohmann::json PromptLogprobsJson(const PromptLogprobs& p, int32_t top_n) {
  using json = nlohmann::json;
  json out = json::array();
  for (size_t i = 0; i < p.token_ids.size(); ++i) {
    if (i == 0) {
      out.push_back(nullptr);
      continue;
    }
    const auto entry = [](float logprob, int32_t rank, const std::string& bytes, int32_t id) {
      return json{{"logprob", logprob},
                  {"rank", rank},
                  {"decoded_token", LogprobTokenString(bytes, id)}};
    };
    json position = json::object();
    position[absl::StrCat(p.token_ids[i])] =
        entry(p.logprobs[i], p.ranks[i], p.token_bytes[i], p.token_ids[i]);
    const size_t n = std::min(p.top[i].size(), size_t(std::max(top_n, 0)));
    for (size_t k = 0; k < n; ++k) {
      const TokenLogprob& t = p.top[i][k];
      const std::string key = absl::StrCat(t.token);
      if (!position.contains(key)) {
        position[key] = entry(t.logprob, int32_t(k) + 1, t.bytes, t.token);
      }
    }
    out.push_back(std::move(position));
  }
  return out;
}

}  // namespace heavykv::server
