#include "server/client/bench_http.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace heavykv::cli {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double>(t1 - t0).count();
}

}  // namespace

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * sorted.size()));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

std::string CompletionBody(const v1::GenerateRequest& q) {
  nlohmann::json body = {{"stream", true}, {"stream_options", {{"include_usage", true}}}};
  if (q.has_prompt_token_ids()) {
    body["prompt"] = std::vector<int32_t>(q.prompt_token_ids().ids().begin(),
                                          q.prompt_token_ids().ids().end());
  } else {
    body["prompt"] = q.prompt();
  }
  if (q.has_max_new_tokens()) body["max_tokens"] = q.max_new_tokens();
  const v1::SamplingParams& s = q.sampling();
  if (s.has_temperature()) body["temperature"] = s.temperature();
  if (s.has_top_p()) body["top_p"] = s.top_p();
  if (s.has_top_k()) body["top_k"] = s.top_k();
  if (s.has_seed()) body["seed"] = s.seed();
  if (s.has_min_p()) body["min_p"] = s.min_p();
  if (s.has_presence_penalty()) body["presence_penalty"] = s.presence_penalty();
  if (s.has_frequency_penalty()) body["frequency_penalty"] = s.frequency_penalty();
  if (s.has_repetition_penalty()) body["repetition_penalty"] = s.repetition_penalty();
  if (s.has_penalty_last_n()) body["repeat_last_n"] = s.penalty_last_n();
  if (s.logit_bias_size() > 0) {
    nlohmann::json bias = nlohmann::json::object();  // OpenAI's form: {"id": bias}
    for (const auto& [id, b] : s.logit_bias()) bias[std::to_string(id)] = b;
    body["logit_bias"] = std::move(bias);
  }
  if (s.min_tokens() > 0) body["min_tokens"] = s.min_tokens();
  if (q.stop_size() > 0) body["stop"] = std::vector<std::string>(q.stop().begin(), q.stop().end());
  if (q.ignore_eos()) body["ignore_eos"] = true;
  const v1::KvParams& kv = q.kv();
  if (kv.has_policy()) body["kv_policy"] = kv.policy();
  if (kv.budget_case() == v1::KvParams::kBudgetTokens) body["kv_budget"] = kv.budget_tokens();
  if (kv.budget_case() == v1::KvParams::kBudgetFraction) body["kv_budget"] = kv.budget_fraction();
  if (kv.has_recent_fraction()) body["kv_recent_fraction"] = kv.recent_fraction();
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

StreamTiming StreamCompletion(httplib::Client& client, const std::string& body,
                              const std::string& api_key,
                              const std::function<void(int64_t events)>& on_text) {
  StreamTiming out;
  int64_t text_events = 0;
  const Clock::time_point start = Clock::now();
  Clock::time_point last = start;
  std::string pending;  // SSE bytes not yet split into events
  bool done = false, malformed = false;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body;
  req.set_header("Content-Type", "application/json");
  if (!api_key.empty()) req.set_header("Authorization", "Bearer " + api_key);
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    pending.append(data, n);
    for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
      const std::string event = pending.substr(0, end);
      pending.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) {
        malformed = true;
        return false;
      }
      if (event == "data: [DONE]") {
        done = true;
        continue;
      }
      const nlohmann::json chunk = nlohmann::json::parse(event.substr(6), nullptr, false);
      if (chunk.is_discarded() || chunk.contains("error")) {
        malformed = true;
        return false;
      }
      if (chunk.contains("usage") && chunk["usage"].is_object()) {
        out.prompt_tokens = chunk["usage"].value("prompt_tokens", 0);
        out.completion_tokens = chunk["usage"].value("completion_tokens", 0);
      }
      const nlohmann::json& choices = chunk["choices"];
      if (choices.is_array() && !choices.empty() && choices[0].contains("finish_reason") &&
          choices[0]["finish_reason"].is_string()) {
        out.finish_reason = choices[0]["finish_reason"].get<std::string>();
      }
      if (!choices.is_array() || choices.empty() || !choices[0].contains("text") ||
          !choices[0]["text"].is_string() || choices[0]["text"].get_ref<const std::string&>().empty()) {
        continue;
      }
      const Clock::time_point now = Clock::now();
      if (out.ttft < 0) {
        out.ttft = SecondsSince(start, now);
      } else {
        out.itl.push_back(SecondsSince(last, now));
      }
      last = now;
      out.text += choices[0]["text"].get_ref<const std::string&>();
      if (on_text) on_text(++text_events);
    }
    return true;
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  const bool sent = client.send(req, res, error);
  if (!sent && res.status <= 0) {
    out.error = malformed ? "bad_stream" : "connection";
  } else if (res.status != 200) {
    out.error = absl::StrCat("http_", res.status);
  } else if (malformed || !done) {
    out.error = "bad_stream";
  }
  return out;
}

}  // namespace heavykv::cli
