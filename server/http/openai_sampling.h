// The sampling API's fields of an OpenAI-style request body (docs/ARCHITECTURE.md "The sampling
// API"), under OpenAI's, vLLM's and llama.cpp's names:
//   presence_penalty, frequency_penalty   OpenAI: over the generated tokens
//   repetition_penalty                    vLLM: over prompt + generated, every token
//   repeat_penalty, repeat_last_n         llama.cpp: the same over the last repeat_last_n (64 by
//                                         default; -1 all, 0 none)
//   min_p, min_tokens                     vLLM
//   logit_bias                            OpenAI: {"token id": bias}
//   n_probs                               llama.cpp: top logprobs (turns logprobs on)
// The ranges are the engine's to check (request_validation.h), so gRPC and HTTP refuse alike.
// The known fields that would change the output and are not served (typical_p, mirostat,
// dry_multiplier, bad_words, ...) are refused by name, never ignored.
#pragma once

#include "absl/status/status.h"
#include "engine/serving/engine.h"
#include "server/http/openai_fields.h"

namespace heavykv::server {

// Reads the fields above from `f` into `r`; errors go to f.status() (the first one wins).
void ReadSamplingFields(Fields& f, GenerationRequest& r);

}  // namespace heavykv::server
