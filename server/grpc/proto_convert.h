// Conversions between the heavykv.v1 messages and the engine's plain structs. The proto-level
// checks (a missing prompt) live here; everything else is validated by Engine::Submit.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "engine/serving/engine.h"
#include "heavykv/v1/generation.pb.h"

namespace heavykv::server {

// INVALID_ARGUMENT when neither prompt nor prompt_token_ids is set. The deadline is left unset.
absl::StatusOr<GenerationRequest> FromProto(const v1::GenerateRequest& request);
// The conversation and Generate's fields; the engine checks the messages (Engine::Submit).
absl::StatusOr<GenerationRequest> FromProto(const v1::ChatRequest& request);

// Appends a delta of one choice to `response` (its index, token ids, text, logprobs, and the
// prompt's logprobs when the delta carries them); a choice's last delta sets finish_reason, the
// request's last also usage and timings.
void AppendDelta(const GenerationDelta& delta, v1::GenerateResponse* response);

v1::FinishReason FinishReasonFromName(const std::string& name);  // "length", "stop", ...
std::string FinishReasonName(v1::FinishReason reason);           // the inverse

void ToProto(const ModelInfo& info, v1::ModelInfo* out);
void ToProto(const CacheStats& stats, v1::CacheStats* out);

}  // namespace heavykv::server
