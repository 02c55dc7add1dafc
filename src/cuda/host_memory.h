// What callers outside the CUDA executor ask of the device's runtime about memory: page-locking
// host ranges the executor will copy from (expert records of the host tiers, the bench's pools)
// and the device's free memory for the expert plan. The engine and the commands call these, never
// the CUDA runtime itself. Host header, no CUDA types.
#pragma once

#include <cstddef>

namespace fb::cuda {

// Page-locks [p, p + n) so copies from it run at the pinned rate. A failure only costs copy speed:
// it is cleared, not reported.
void pin_host_range(void* p, size_t n);
// Undoes pin_host_range(p, ...); failures are cleared likewise.
void unpin_host_range(void* p);
// Free and total memory of the current device; false (nothing written) when there is no device to ask.
bool device_memory(size_t* free_bytes, size_t* total_bytes);

}  // namespace fb::cuda
