// CRC-32C (Castagnoli): checksums of the expert store and of serialized sessions. Hardware
// crc32 instructions when the CPU has SSE4.2 (three interleaved streams on long inputs), a table
// otherwise; all give the same values.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fb {

uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace fb
