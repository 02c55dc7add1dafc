// CRC-32C (Castagnoli): the per-expert and per-header checksum of the expert store. Hardware
// crc32 instructions when the CPU has SSE4.2, a table otherwise; both give the same values.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fb::storage {

uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace fb::storage
