#include "engine/tokenizer/special_tokens.h"

#include <algorithm>
#include <initializer_list>
#include <utility>

namespace heavykv {

void SpecialTokenMatcher::Add(int32_t id, std::string text, bool control, bool rstrip) {
  if (text.empty()) return;
  const auto first = static_cast<unsigned char>(text[0]);
  by_first_byte_[first].push_back(Entry{id, control, rstrip, std::move(text)});
  ++count_;
}

void SpecialTokenMatcher::Finish() {
  // Longest first, so the first entry that matches at a position is the longest there; equal
  // lengths keep their id order.
  for (std::vector<Entry>& bucket : by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(), [](const Entry& a, const Entry& b) {
      return a.text.size() > b.text.size();
    });
  }
}

SpecialTokenMatcher::Match SpecialTokenMatcher::Find(std::string_view text, size_t from,
                                                     bool parse_control) const {
  if (count_ == 0) return Match{};
  for (size_t i = from; i < text.size(); ++i) {
    for (const Entry& e : by_first_byte_[static_cast<unsigned char>(text[i])]) {
      if (e.control && !parse_control) continue;
      if (text.size() - i >= e.text.size() && text.compare(i, e.text.size(), e.text) == 0) {
        size_t next = i + e.text.size();
        // llama.cpp strips with isspace() in the "C" locale.
        while (e.rstrip && next < text.size() &&
               (text[next] == ' ' || (text[next] >= '\t' && text[next] <= '\r'))) {
          ++next;
        }
        return Match{i, e.id, e.text.size(), next};
      }
    }
  }
  return Match{};
}

bool IsTurnEndText(std::string_view text) {
  for (std::string_view turn_end : {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                                    "<|endoftext|>", "<|eom_id|>", "<EOT>"}) {
    if (text == turn_end) return true;
  }
  return false;
}

}  // namespace heavykv
