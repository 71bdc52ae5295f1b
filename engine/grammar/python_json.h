// JSON text as Python's json.dumps(value, ensure_ascii=False) writes it (", " and ": "
// separators, floats as repr(), non-ASCII as UTF-8): how JSON-Schema-Test-Suite instances are
// written before they are tokenized (`heavykv grammar test`), and what a model imitating
// Python-formatted JSON writes.
#pragma once

#include <string>

#include "nlohmann/json.hpp"

namespace heavykv::grammar {

std::string PythonJsonDumps(const nlohmann::ordered_json& value);
// A double as Python's repr(float): "1.0", "1e+16", "1.5e-07", "inf" -> "Infinity".
std::string PythonFloatRepr(double d);

}  // namespace heavykv::grammar
