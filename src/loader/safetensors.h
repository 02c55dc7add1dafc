// Safetensors container (spec/10 §2.1): 8-byte LE header length, JSON header, data area.
// Parsing validates everything against the file size so that a hostile or truncated file is a
// Status naming the file and tensor, never a crash or an out-of-range read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"

namespace fb::loader {

// Headers above this are refused (the released shards' headers are ~260 KB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // relative to the data area
  uint64_t end = 0;
};

struct SafetensorsHeader {
  uint64_t data_start = 0;  // absolute file offset of the data area
  std::vector<SafetensorsEntry> entries;
};

// `file` names the file in error messages.
Result<SafetensorsHeader> parse_safetensors(const uint8_t* data, size_t size, const std::string& file);

// Writer used by make-tiny and tests: tensors in the given order, header padded to 8 bytes.
struct SafetensorsTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
Status write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors);

}  // namespace fb::loader
