#include "engine/stop_strings.h"

#include <algorithm>
#include <utility>

namespace fb::engine {

StopStrings::StopStrings(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopStrings::feed(std::string_view text) {
  if (stopped_) return {};
  held_.append(text);
  if (stops_.empty()) return std::exchange(held_, {});
  // Earliest complete match wins (ties: the longer stop string, which starts at the same byte).
  size_t best = std::string::npos;
  for (const auto& s : stops_) {
    const size_t at = held_.find(s);
    if (at != std::string::npos && (best == std::string::npos || at < best || (at == best && s.size() > matched_.size()))) {
      best = at;
      matched_ = s;
    }
  }
  if (best != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, best);
    held_.clear();
    return out;
  }
  // Hold the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    const size_t max_len = std::min(s.size() - 1, held_.size());
    for (size_t len = max_len; len > hold; --len)
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
  }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopStrings::finish() {
  if (stopped_) return {};
  return std::exchange(held_, {});
}

}  // namespace fb::engine
