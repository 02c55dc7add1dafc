// Decode benchmarks at long contexts without running the prefill: fills a CUDA session's caches
// (window rings, compressed KV, index keys, compressor tails, token history) with valid random
// compact rows up to position L. The decode step's cost depends on the cache SIZES (window rows,
// entries scanned by the indexers, selected rows), not on their values, so this measures exactly
// the work a real session at context L does. [policy] benchmark-only.
#pragma once

#include "base/status.h"
#include "cuda/executor.h"

namespace fb::bench {

Status fill_fake_context(cuda::CudaExecutor& ex, cuda::CudaSession& s, int64_t L, uint64_t seed);

}  // namespace fb::bench
