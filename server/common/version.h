// heavykv's version, as GET /version reports it on the OpenAI HTTP port (vLLM's route).
#pragma once

namespace heavykv {

inline constexpr char kHeavykvVersion[] = "0.1.0";

}  // namespace heavykv
