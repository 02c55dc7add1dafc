// Engram compressed token map (spec/15 §5, spec/11 §6.1): token id -> normalised class, derived
// from the tokenizer with ICU. Pure function of the tokenizer; checked against the table HF
// `tokenizers` produces (tools/tokenizer/engram_map.py). The pad class is map[2], not 2.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "tokenizer/tokenizer.h"

namespace fb::tokenizer {

struct EngramMap {
  std::vector<int32_t> map;  // [vocab_size] int32 class id per token id
  int32_t n_classes = 0;
  int32_t pad_class() const { return map.size() > 2 ? map[2] : 0; }
};

// V4.1 reference values (spec/15 §5).
inline constexpr int32_t kEngramV41Classes = 99092;
inline constexpr const char* kEngramV41Sha256 = "c60a86322ec17b4142bfef3c57a8d81fb428550cdf487f88a4320cb59fe46481";

// Derives the map. Fails only if ICU's normaliser cannot be loaded.
Result<EngramMap> derive_engram_map(const Tokenizer& tok);
// The normalised class key of one token (exposed for tests and diagnostics).
std::string engram_class_key(const Tokenizer& tok, int32_t id);
// sha256 of the map as little-endian int32 (the spec's checksum layout).
std::string engram_map_sha256(const std::vector<int32_t>& map);

}  // namespace fb::tokenizer
