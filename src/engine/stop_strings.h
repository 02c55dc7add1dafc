// StopStrings: client stop sequences over streamed answer text (spec/16 §3). Text that could be
// the start of a stop string is held back until it either completes a match (the match and all
// after it are dropped) or diverges (then it is released). Invariant: the concatenation of the
// released text equals the input up to the first complete match, in any chunking.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace fb::engine {

class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops);
  // Appends text; returns what is now safe to release. After a match, stopped() is true and
  // further input is ignored.
  std::string feed(std::string_view text);
  // End of generation: releases the held-back tail (no match can complete any more).
  std::string finish();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }
  size_t held_bytes() const { return held_.size(); }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace fb::engine
