// libFuzzer entry for the untrusted-input parsers of the loader: the safetensors header and the
// HF config. Build: cmake -DFB_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ (tools/fuzz.sh does it).
// Any crash, hang or sanitizer report is a bug; a Status error is the expected outcome.
#include <cstddef>
#include <cstdint>
#include <string>

#include "loader/safetensors.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // First byte picks the parser so one corpus covers both.
  const uint8_t* p = data + 1;
  const size_t n = size - 1;
  if (data[0] & 1) {
    auto r = fb::loader::parse_safetensors(p, n, "fuzz");
    (void)r;
  } else {
    auto c = fb::model::Config::from_hf_json(std::string(reinterpret_cast<const char*>(p), n));
    (void)c;
  }
  return 0;
}
