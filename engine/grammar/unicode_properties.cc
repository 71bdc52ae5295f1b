#include "engine/grammar/unicode_properties.h"

#include <initializer_list>
#include <iterator>

namespace heavykv::grammar {
namespace {

struct CategoryRun {
  uint32_t first;
  uint8_t category;  // an index into kCategoryNames
};

#include "engine/grammar/unicode_categories.inc"

constexpr int kNumCategories = int(std::size(kCategoryNames));

uint32_t CategoryBit(std::string_view short_name) {
  for (int i = 0; i < kNumCategories; ++i) {
    if (short_name == kCategoryNames[i]) return uint32_t{1} << i;
  }
  return 0;
}

// The General_Category values as ECMA-262 names them (PropertyValueAliases.txt): a short name,
// a long name (and an alias), and the categories it stands for.
struct Value {
  const char* short_name;
  const char* long_name;
  const char* alias;
  std::initializer_list<const char*> categories;
};

const Value kValues[] = {
    {"L", "Letter", "", {"Lu", "Ll", "Lt", "Lm", "Lo"}},
    {"LC", "Cased_Letter", "", {"Lu", "Ll", "Lt"}},
    {"Lu", "Uppercase_Letter", "", {"Lu"}},
    {"Ll", "Lowercase_Letter", "", {"Ll"}},
    {"Lt", "Titlecase_Letter", "", {"Lt"}},
    {"Lm", "Modifier_Letter", "", {"Lm"}},
    {"Lo", "Other_Letter", "", {"Lo"}},
    {"M", "Mark", "Combining_Mark", {"Mn", "Mc", "Me"}},
    {"Mn", "Nonspacing_Mark", "", {"Mn"}},
    {"Mc", "Spacing_Mark", "", {"Mc"}},
    {"Me", "Enclosing_Mark", "", {"Me"}},
    {"N", "Number", "", {"Nd", "Nl", "No"}},
    {"Nd", "Decimal_Number", "digit", {"Nd"}},
    {"Nl", "Letter_Number", "", {"Nl"}},
    {"No", "Other_Number", "", {"No"}},
    {"P", "Punctuation", "punct", {"Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po"}},
    {"Pc", "Connector_Punctuation", "", {"Pc"}},
    {"Pd", "Dash_Punctuation", "", {"Pd"}},
    {"Ps", "Open_Punctuation", "", {"Ps"}},
    {"Pe", "Close_Punctuation", "", {"Pe"}},
    {"Pi", "Initial_Punctuation", "", {"Pi"}},
    {"Pf", "Final_Punctuation", "", {"Pf"}},
    {"Po", "Other_Punctuation", "", {"Po"}},
    {"S", "Symbol", "", {"Sm", "Sc", "Sk", "So"}},
    {"Sm", "Math_Symbol", "", {"Sm"}},
    {"Sc", "Currency_Symbol", "", {"Sc"}},
    {"Sk", "Modifier_Symbol", "", {"Sk"}},
    {"So", "Other_Symbol", "", {"So"}},
    {"Z", "Separator", "", {"Zs", "Zl", "Zp"}},
    {"Zs", "Space_Separator", "", {"Zs"}},
    {"Zl", "Line_Separator", "", {"Zl"}},
    {"Zp", "Paragraph_Separator", "", {"Zp"}},
    {"C", "Other", "", {"Cc", "Cf", "Cs", "Co", "Cn"}},
    {"Cc", "Control", "cntrl", {"Cc"}},
    {"Cf", "Format", "", {"Cf"}},
    {"Cs", "Surrogate", "", {"Cs"}},
    {"Co", "Private_Use", "", {"Co"}},
    {"Cn", "Unassigned", "", {"Cn"}},
};

// The set of categories a General_Category value names; 0 for an unknown name.
uint32_t CategoryMask(std::string_view name) {
  for (const Value& v : kValues) {
    if (name == v.short_name || name == v.long_name || (*v.alias && name == v.alias)) {
      uint32_t mask = 0;
      for (const char* c : v.categories) mask |= CategoryBit(c);
      return mask;
    }
  }
  return 0;
}

void AppendCategories(uint32_t mask, std::vector<std::pair<uint32_t, uint32_t>>* out) {
  constexpr int kNumRuns = int(std::size(kCategoryRuns));
  for (int i = 0; i < kNumRuns; ++i) {
    if (!((mask >> kCategoryRuns[i].category) & 1)) continue;
    const uint32_t last = i + 1 < kNumRuns ? kCategoryRuns[i + 1].first - 1 : 0x10FFFF;
    out->push_back({kCategoryRuns[i].first, last});
  }
}

}  // namespace

std::string_view UnicodePropertiesVersion() { return kUnicodeVersion; }

bool AppendUnicodeProperty(std::string_view name, std::vector<std::pair<uint32_t, uint32_t>>* out) {
  if (name == "Any") {
    out->push_back({0, 0x10FFFF});
    return true;
  }
  if (name == "ASCII") {
    out->push_back({0, 0x7F});
    return true;
  }
  if (name == "ASCII_Hex_Digit" || name == "AHex") {
    out->insert(out->end(), {{'0', '9'}, {'A', 'F'}, {'a', 'f'}});
    return true;
  }
  if (name == "Assigned") {
    AppendCategories(~CategoryBit("Cn") & ((uint32_t{1} << kNumCategories) - 1), out);
    return true;
  }
  for (std::string_view prefix : {"General_Category=", "gc="}) {
    if (name.starts_with(prefix)) {
      name.remove_prefix(prefix.size());
      break;
    }
  }
  const uint32_t mask = CategoryMask(name);
  if (mask == 0) return false;
  AppendCategories(mask, out);
  return true;
}

}  // namespace heavykv::grammar
