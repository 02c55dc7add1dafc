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

namespace fb::bench {

// GPU time of one batch-1 decode step without host launches: the step at the session's next
// position is captured once into a CUDA graph (cudaStreamCaptureModeRelaxed; the executor's
// capture mode skips syncs and downloads) and replayed `reps` times. Each replay redoes the same
// position, so caches end as after one step; the session is then rolled back to where it was.
// [policy] benchmark-only: measures how much of a step is launch overhead.
struct GraphStepTiming {
  double replay_ms = 0;       // median replay time
  double capture_ms = 0;      // host time to capture the step
  double instantiate_ms = 0;  // cudaGraphInstantiate
  size_t nodes = 0;
};
Result<GraphStepTiming> time_graph_step(cuda::CudaExecutor& ex, model::SessionState& s, int reps);

}  // namespace fb::bench
