// Plain-C++ fuzz loop (no libFuzzer needed): structure-aware random DSML outputs and random text
// through encode/decode; the properties are checked inside the targets (fuzz_targets.h). CI runs
// ~20 s from a fixed seed; FB_FUZZ_SECONDS (per target) and FB_FUZZ_SEED for a long campaign,
// e.g. FB_FUZZ_SECONDS=600 FB_FUZZ_SEED=7 ./tokenizer_fuzz_test --gtest_filter='*Dsml*'.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <random>

#include "tokenizer/fuzz_targets.h"
#include "tokenizer/test_assets.h"

namespace fb::tokenizer {
namespace {

// Fixed by default so a CI failure reproduces; FB_FUZZ_SEED=N for another stream of inputs.
uint64_t seed_of_run() {
  const char* s = std::getenv("FB_FUZZ_SEED");  // test driver only, never product code
  return s ? std::strtoull(s, nullptr, 10) : 20261201u;
}

double budget_seconds(double dflt) {
  const char* s = std::getenv("FB_FUZZ_SECONDS");  // test driver only, never product code
  return s ? std::atof(s) : dflt;
}

template <typename F>
uint64_t run_for(double seconds, F&& body) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  uint64_t iters = 0;
  while (std::chrono::steady_clock::now() < end) {
    for (int k = 0; k < 64; ++k) body(iters++);
  }
  return iters;
}

TEST(Fuzz, DsmlParser) {
  const uint64_t seed0 = seed_of_run();
  std::printf("seed %llu\n", (unsigned long long)seed0);
  const uint64_t n = run_for(budget_seconds(10), [&](uint64_t i) {
    const std::string s = std::string(1, char((seed0 + i) & 0xFF)) + fuzz_random_output_text(seed0 * 1000003 + i);
    fuzz_dsml_parser(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  });
  std::printf("dsml parser: %llu inputs, no failure\n", (unsigned long long)n);
  RecordProperty("inputs", std::to_string(n));
}

TEST(Fuzz, EncodeDecode) {
  const Tokenizer& tok = v41_tokenizer();
  const uint64_t seed0 = seed_of_run();
  std::printf("seed %llu\n", (unsigned long long)seed0);
  const uint64_t n = run_for(budget_seconds(10), [&](uint64_t i) {
    std::mt19937_64 rng(seed0 + i);
    std::string s;
    const int len = int(rng() % 200);
    // Mix of raw bytes, ASCII, multi-byte characters and added-token fragments.
    static const char* kPieces[] = {"<｜User｜>", "<think>", "</think>", "｜DSML｜", "<｜", "中", "😀", "\r\n", "  ",
                                    "123456", "é", "\xCC\x81", "<|EOT|>", "<dsml:"};
    while (int(s.size()) < len) {
      const uint64_t r = rng() % 4;
      if (r == 0) s.push_back(char(rng() % 256));
      else if (r == 1) s.push_back(char(0x20 + rng() % 95));
      else s += kPieces[rng() % (sizeof kPieces / sizeof kPieces[0])];
    }
    fuzz_encode_decode(tok, reinterpret_cast<const uint8_t*>(s.data()), s.size());
  });
  std::printf("encode/decode: %llu inputs, no failure\n", (unsigned long long)n);
}

}  // namespace
}  // namespace fb::tokenizer
