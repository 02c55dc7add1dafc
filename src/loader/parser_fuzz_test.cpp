// Bounded mutation fuzzing of the safetensors header and config parsers without libFuzzer (runs in
// every build); the libFuzzer target (fuzz_parsers.cpp) explores further under tools/fuzz.sh.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>

#include "base/mapped_file.h"
#include "loader/safetensors.h"
#include "model/config.h"

namespace fb::loader {
namespace {

std::string seed_header() {
  std::string h = R"({"a":{"dtype":"BF16","shape":[2,4],"data_offsets":[0,16]},"b":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[16,24]},"__metadata__":{"format":"pt"}})";
  while (h.size() % 8) h.push_back(' ');
  std::string out(8, '\0');
  uint64_t n = h.size();
  std::memcpy(out.data(), &n, 8);
  return out + h + std::string(24, '\x01');
}

void mutate(std::string& s, std::mt19937_64& rng) {
  const int k = int(rng() % 4);
  if (s.empty()) s.push_back('x');
  const size_t pos = rng() % s.size();
  switch (k) {
    case 0: s[pos] = char(rng()); break;
    case 1: s.erase(pos, 1 + rng() % 8); break;
    case 2: s.insert(pos, std::string(1 + rng() % 4, char(rng()))); break;
    default: {
      static const char* kTokens[] = {"\"", "{", "}", "[", "]", ",", ":", "-1", "1e309", "18446744073709551615", "null", "\"F32\""};
      s.insert(pos, kTokens[rng() % 12]);
    }
  }
}

TEST(ParserFuzz, SafetensorsAndConfigSurviveMutations) {
  std::mt19937_64 rng(12345);
  const std::string st = seed_header();
  auto cfg_text = read_file_bytes(std::string(FB_SOURCE_DIR) + "/tests/data/released_config.json");
  ASSERT_TRUE(cfg_text.ok());
  ASSERT_TRUE(parse_safetensors(reinterpret_cast<const uint8_t*>(st.data()), st.size(), "seed").ok());
  const auto t0 = std::chrono::steady_clock::now();
  int64_t n = 0, accepted = 0;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(8)) {
    std::string a = st;
    for (int m = 0, k = 1 + int(rng() % 6); m < k; ++m) mutate(a, rng);
    accepted += parse_safetensors(reinterpret_cast<const uint8_t*>(a.data()), a.size(), "fuzz").ok();
    std::string c = *cfg_text;
    for (int m = 0, k = 1 + int(rng() % 6); m < k; ++m) mutate(c, rng);
    accepted += model::Config::from_hf_json(c).ok();
    n += 2;
  }
  RecordProperty("inputs", std::to_string(n));
  EXPECT_GT(n, 1000);
  std::printf("parser fuzz: %lld inputs, %lld accepted\n", (long long)n, (long long)accepted);
}

}  // namespace
}  // namespace fb::loader
