// libFuzzer driver (FB_FUZZ=ON, clang): one binary per target, chosen by a compile definition.
#include <cstddef>
#include <cstdint>

#include "tokenizer/fuzz_targets.h"
#include "tokenizer/test_assets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t n) {
#if defined(FB_FUZZ_TARGET_dsml)
  return fb::tokenizer::fuzz_dsml_parser(data, n);
#else
  return fb::tokenizer::fuzz_encode_decode(fb::tokenizer::v41_tokenizer(), data, n);
#endif
}
