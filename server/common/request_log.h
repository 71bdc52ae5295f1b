// The one log line a finished request gets, from either front (gRPC, server/grpc/grpc_service.cc;
// the OpenAI HTTP API, server/http/openai_http.cc): its id (escaped by the caller; never client
// text), token counts, timings, KV policy and pages, and how it ended.
#pragma once

#include <string_view>

#include "engine/serving/engine.h"

namespace heavykv::server {

void LogFinished(std::string_view log_id, const GenerationDelta& last);

}  // namespace heavykv::server
