// Sha256: FIPS 180-4 digest, used to identify tokenizer files and check the Engram map
// (spec/15 §5). Small and dependency-free so the tokenizer needs no crypto library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace fb::tokenizer {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  std::string hex_digest();  // finalises; call once

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_n_ = 0;
  uint64_t total_bytes_ = 0;
};

std::string sha256_hex(std::string_view bytes);

}  // namespace fb::tokenizer
