// Unicode properties for the regex compiler's \p{..} (regex.h): General_Category values by their
// short and long names (L, Letter, Lu, Uppercase_Letter, ..., also as gc=X and
// General_Category=X) and the binary properties Any, ASCII, ASCII_Hex_Digit (AHex) and Assigned,
// from Unicode's tables as unicode_categories.inc holds them (make_unicode_categories.py).
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace heavykv::grammar {

// The Unicode version of the tables.
std::string_view UnicodePropertiesVersion();

// Appends the code point ranges of the property `name` (what ECMA-262's \p{name} matches) to
// `out`; false for a name it does not know (scripts, other binary properties).
bool AppendUnicodeProperty(std::string_view name, std::vector<std::pair<uint32_t, uint32_t>>* out);

}  // namespace heavykv::grammar
