#include "server/http/openai_logprobs.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace heavykv::server {

using json = nlohmann::json;

namespace {

// Code points in UTF-8 text (bytes that do not continue a character).
int64_t CodePoints(absl::string_view text) {
  int64_t n = 0;
  for (char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

json ByteList(const std::string& bytes) {
  json out = json::array();
  for (char c : bytes) out.push_back(static_cast<unsigned char>(c));
  return out;
}

}  // namespace

std::string LogprobTokenString(const std::string& bytes, int32_t id) {
  return bytes.empty() ? absl::StrCat("token_id:", id) : bytes;
}

void LogprobsJson::AddPrompt(const PromptLogprobs& p, int32_t top_n, absl::string_view text) {
  if (!enabled_ || kind_ != ApiKind::kCompletion) return;
  Start();
  // A token's offset is where its bytes are in the text; one whose bytes the text does not show
  // there (BOS, a control token) takes the place of the next and moves nothing.
  size_t at = 0;       // bytes of `text` matched so far
  int64_t offset = 0;  // the same in code points
  for (size_t i = 0; i < p.token_ids.size(); ++i) {
    const std::string& bytes = p.token_bytes[i];
    const std::string token = LogprobTokenString(bytes, p.token_ids[i]);
    pending_["tokens"].push_back(token);
    pending_["text_offset"].push_back(offset);
    if (text.substr(std::min(at, text.size()), bytes.size()) == bytes) {
      at += bytes.size();
      offset += CodePoints(bytes);
    }
    if (i == 0) {  // nothing before it to predict it from
      pending_["token_logprobs"].push_back(nullptr);
      pending_["top_logprobs"].push_back(nullptr);
      continue;
    }
    json alternatives = json::object();
    const size_t n = std::min(p.top[i].size(), size_t(std::max(top_n, 0)));
    for (size_t k = 0; k < n; ++k) {
      const TokenLogprob& t = p.top[i][k];
      alternatives[LogprobTokenString(t.bytes, t.token)] = t.logprob;
    }
    alternatives[token] = p.logprobs[i];
    pending_["token_logprobs"].push_back(p.logprobs[i]);
    pending_["top_logprobs"].push_back(std::move(alternatives));
  }
  text_chars_ = CodePoints(text);
}

void LogprobsJson::Add(const GenerationDelta& d) {
  if (!enabled_) return;
  Start();
  const int64_t end = text_chars_ + CodePoints(d.text);
  int64_t offset = text_chars_;
  for (size_t i = 0; i < d.token_ids.size() && i < d.logprobs.size(); ++i) {
    const std::string bytes = i < d.token_bytes.size() ? d.token_bytes[i] : std::string();
    const std::string token = LogprobTokenString(bytes, d.token_ids[i]);
    static const std::vector<TokenLogprob> kNone;
    const std::vector<TokenLogprob>& top = i < d.top_logprobs.size() ? d.top_logprobs[i] : kNone;
    if (kind_ == ApiKind::kChat) {
      json alternatives = json::array();
      for (const TokenLogprob& t : top) {
        alternatives.push_back({{"token", LogprobTokenString(t.bytes, t.token)},
                                {"logprob", t.logprob},
                                {"bytes", ByteList(t.bytes)}});
      }
      pending_["content"].push_back({{"token", token},
                                     {"logprob", d.logprobs[i]},
                                     {"bytes", ByteList(bytes)},
                                     {"top_logprobs", std::move(alternatives)}});
      continue;
    }
    json alternatives = json::object();
    for (const TokenLogprob& t : top) alternatives[LogprobTokenString(t.bytes, t.token)] = t.logprob;
    alternatives[token] = d.logprobs[i];
    pending_["tokens"].push_back(token);
    pending_["token_logprobs"].push_back(d.logprobs[i]);
    pending_["top_logprobs"].push_back(std::move(alternatives));
    pending_["text_offset"].push_back(std::min(offset, end));
    offset += CodePoints(bytes);
  }
  text_chars_ = end;
}

void LogprobsJson::Start() {
  if (!pending_.is_null()) return;
  pending_ = kind_ == ApiKind::kChat ? json{{"content", json::array()}}
                                     : json{{"tokens", json::array()},
                                            {"token_logprobs", json::array()},
                                            {"top_logprobs", json::array()},
                                            {"text_offset", json::array()}};
}

nlohmann::json LogprobsJson::Take() {
  if (!enabled_) return nullptr;
  Start();
  json out = std::move(pending_);
  pending_ = nullptr;
  return out;
}

nlohmann::json PromptLogprobsJson(const PromptLogprobs& p, int32_t top_n) {
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
