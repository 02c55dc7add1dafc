// Fuzz entry points for the DSML output parser and for encode/decode. Each takes arbitrary bytes,
// checks properties with FB_CHECK (abort = finding) and returns 0. Driven by libFuzzer
// (fuzz_main.cpp, FB_FUZZ=ON with clang) or by the plain random loop in fuzz_test.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

namespace fb::tokenizer {

// Properties: never crashes or hangs; any chunking of the input yields the same merged events as
// one feed; tool calls carry non-empty arguments text starting with "{".
int fuzz_dsml_parser(const uint8_t* data, size_t n);
// Properties: decode(encode(x)) == lossy(x) with and without added-token matching; streaming
// decode equals whole decode; every id is valid.
int fuzz_encode_decode(const Tokenizer& tok, const uint8_t* data, size_t n);
// Structure-aware input for the plain loop: DSML/think/EOS fragments, text and random bytes.
std::string fuzz_random_output_text(uint64_t seed);

}  // namespace fb::tokenizer
